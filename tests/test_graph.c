/* The graph API on the CPU backend: no graphs (every call runs when it is made), said plainly:
 * mb_graph_supported is 0, mb_graph_begin fails with MB_ERR_UNSUPPORTED, and mb_graph_run runs
 * its function directly every time, logging that once. (The CUDA side: tests/cuda/test_cuda_graph.cu.) */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch.h"
#include "testutil.h"

typedef struct counted { int info, other; } counted;
static void count_log(mb_log_level level, const char *msg, const char *file, int line, void *user) {
    (void)file; (void)line;
    counted *c = (counted *)user;
    if (level == MB_LOG_INFO && strstr(msg, "the CPU backend has no graphs")) c->info++;
    else c->other++;
}

static mb_result bump(void *user) {
    (*(int *)user)++;
    return MB_OK;
}
static mb_result refuse(void *user) {
    (void)user;
    return MB_FAIL(NULL, MB_ERR_INVALID_ARG, "refuse: as asked");
}

static void test_cpu_has_no_graphs(void **state) {
    (void)state;
    counted log = {0, 0};
    mb_device_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.log.fn = count_log; cfg.log.user = &log; cfg.log.max = MB_LOG_DEBUG;
    mb_device *dev;
    tu_ok(mb_device_open(&dev, &cfg));
    assert_int_equal(mb_graph_supported(dev), 0);
    assert_int_equal(mb_graph_supported(NULL), 0);
    tu_assert_error(mb_graph_begin(dev, 0), MB_ERR_UNSUPPORTED, "has no graphs");
    mb_graph *g = (mb_graph *)1;
    tu_assert_error(mb_graph_end(dev, &g), MB_ERR_STATE, "no capture under way");
    assert_null(g);
    int calls = 0;
    for (int i = 0; i < 3; i++) tu_ok(mb_graph_run(&g, dev, 0, bump, &calls));
    assert_null(g);
    assert_int_equal(calls, 3);
    tu_assert_error(mb_graph_run(&g, dev, 0, refuse, NULL), MB_ERR_INVALID_ARG, "refuse: as asked");
    assert_int_equal(log.info, 1); /* the fallback, once */
    tu_assert_error(mb_graph_run(&g, dev, 0, NULL, NULL), MB_ERR_INVALID_ARG, "NULL argument");
    tu_assert_error(mb_graph_launch(NULL), MB_ERR_INVALID_ARG, "g is NULL");
    assert_int_equal(mb_graph_nodes(NULL), 0);
    mb_graph_destroy(NULL);
    mb_device_close(dev);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpu_has_no_graphs)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
