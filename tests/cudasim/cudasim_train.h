/* cudasim_train.h - the simulator's side of examples/mb_train.h's counter hook: the work of a
 * training step, for the example's summary line (launches_per_step: kernels + cuBLAS calls run,
 * directly or as graph nodes; graphs_per_step; syncs_per_step), over the steps the trainer marks
 * (those after the warm-up step: validation and the epoch-end reads left out). cudasim.h
 * includes it, so every simulator build has these definitions and mb_train.h leaves out its
 * no-op ones (MBT_SIM_COUNT); the example itself never names the simulator. */
#ifndef CUDASIM_TRAIN_H
#define CUDASIM_TRAIN_H
#include <cstdint>
#include <cstdio>
#define MBT_SIM_COUNT 1

struct cudasim_train_counts {
    cudasim::stats from; /* where the current span started */
    double launches, graphs, syncs, steps;
    char text[160];
};
static inline cudasim_train_counts &cudasim_train() {
    static cudasim_train_counts c;
    return c;
}

/* The counted steps start here (again: the warm-up step is not one of them). */
static inline void mbt_sim_count_from(void) { cudasim_train().from = cudasim::get_stats(); }

/* `steps` steps since mbt_sim_count_from: their host syncs up to here, and their launches once
 * they have run (the device waited for without counting a sync of the program's). */
static inline void mbt_sim_count_to(int64_t steps) {
    cudasim_train_counts &c = cudasim_train();
    cudasim::stats s = cudasim::get_stats();
    c.syncs += (double)(s.host_syncs - c.from.host_syncs);
    cudasim::wait_idle();
    s = cudasim::get_stats();
    c.launches += (double)(s.launches + s.cublas_calls) - (double)(c.from.launches + c.from.cublas_calls);
    c.graphs += (double)(s.graph_launches - c.from.graph_launches);
    c.steps += (double)steps;
}

/* The summary line's counters: averages over every span counted. */
static inline const char *mbt_sim_count_text(void) {
    cudasim_train_counts &c = cudasim_train();
    double n = c.steps > 0 ? c.steps : 1;
    snprintf(c.text, sizeof c.text, " launches_per_step=%.1f graphs_per_step=%.2f syncs_per_step=%.2f", c.launches / n,
             c.graphs / n, c.syncs / n);
    return c.text;
}
#endif /* CUDASIM_TRAIN_H */
