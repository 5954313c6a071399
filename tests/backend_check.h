/* backend_check.h - a backend's table is complete, and mb_device_open's check of it sees any
 * slot left out (include after the implementation and testutil.h). */
#ifndef BACKEND_CHECK_H
#define BACKEND_CHECK_H

typedef struct bc_group { size_t off, bytes; int optional; } bc_group;
#define BC_GROUP(g, optional) {offsetof(mb__backend, g), sizeof *((mb__backend *)0)->g, optional}

static void bc_set(mb__backend *t, const bc_group *g, const void *ops) { memcpy((char *)t + g->off, &ops, sizeof ops); }

/* The table is complete; without any required group, or with any one slot of any group set
 * to NULL, it is not (the optional groups may be NULL as a whole). */
static void bc_check_table(const mb__backend *be) {
    const bc_group gs[] = {BC_GROUP(rt, 0),    BC_GROUP(gemm, 0), BC_GROUP(params, 0), BC_GROUP(series, 0),
                           BC_GROUP(lstm, 0),  BC_GROUP(layers, 0), BC_GROUP(loss, 0),
                           BC_GROUP(amp, 0),   BC_GROUP(optim, 0), BC_GROUP(step, 0),  BC_GROUP(dist, 1),
                           BC_GROUP(graph, 1)};
    size_t n = sizeof gs / sizeof *gs;
    assert_int_equal(n * sizeof(void *), sizeof(mb__backend) - offsetof(mb__backend, rt)); /* every group listed */
    assert_true(mb__backend_complete(be));
    for (size_t i = 0; i < n; i++) {
        mb__backend t = *be;
        const void *ops;
        memcpy(&ops, (const char *)be + gs[i].off, sizeof ops);
        bc_set(&t, &gs[i], NULL);
        assert_int_equal(mb__backend_complete(&t), gs[i].optional);
        unsigned char buf[512];
        assert_true(gs[i].bytes <= sizeof buf);
        for (size_t at = 0; ops && at < gs[i].bytes; at += sizeof(void (*)(void))) {
            memcpy(buf, ops, gs[i].bytes);
            memset(buf + at, 0, sizeof(void (*)(void)));
            bc_set(&t, &gs[i], buf);
            assert_false(mb__backend_complete(&t));
        }
    }
}

#endif
