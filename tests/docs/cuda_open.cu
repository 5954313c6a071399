/* cuda_open.cu - the README's CUDA example: a whole program, compiled by nvcc in the Makefile's
 * compile checks (the README's block is the region between the snippet markers). */
// snippet: readme-cuda
#define MEGABATCH_IMPLEMENTATION
#include "megabatch_cuda.cuh"     /* a .cu file (nvcc compiles a .c file as plain C) */
#include <stdio.h>

int main(void) {
    mb_device *dev;
    mb_device_config cfg = {0};
    cfg.backend = MB_CUDA;        /* MB_ERR_NO_DEVICE with a clear message when no GPU */
    if (mb_device_open(&dev, &cfg) != MB_OK) {
        fprintf(stderr, "error: %s\n", mb_last_error());
        return 1;
    }
    printf("device: %s\n", mb_device_name(dev));
    mb_device_close(dev);
    return 0;
}
// end snippet
