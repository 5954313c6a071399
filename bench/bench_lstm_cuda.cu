/* The CUDA build of bench_lstm.c: the same single source, compiled by nvcc. */
#include "bench_lstm.c"
