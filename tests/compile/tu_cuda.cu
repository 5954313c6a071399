/* The CUDA header through nvcc with -Werror all-warnings (compile check only). */
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"

int tu_cuda_probe(void) {
    mb_device *dev = NULL;
    return mb_device_open(&dev, NULL) == MB_OK ? (mb_device_close(dev), 0) : 1;
}
