/* The CUDA build of train_multitf.c: the same single source, compiled by nvcc. */
#include "train_multitf.c"
