/* The CUDA build of predict.c: the same single source, compiled by nvcc. */
#include "predict.c"
