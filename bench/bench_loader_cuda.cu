/* The CUDA build of bench_loader.c: the same single source, compiled by nvcc (--gpu). */
#include "bench_loader.c"
