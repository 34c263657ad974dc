#include <cuda_runtime.h>
#include "common.h"

__global__ void fill(int* out) { *out = SCALE; }

int kernel_value() {
#ifndef __CUDA_ARCH__
    return scale(4);  // host code: nvcc -E of the device pass never shows this line
#else
    return 0;
#endif
}
