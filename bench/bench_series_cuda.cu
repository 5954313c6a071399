/* The CUDA build of bench_series.c: the same single source, compiled by nvcc (--gpu). */
#ifdef CUDASIM /* under the CPU simulator (tests/cudasim): its counters on stderr at exit */
[[maybe_unused]] static int mb_sim_counters = cudasim::print_stats_at_exit();
#endif
#include "bench_series.c"
