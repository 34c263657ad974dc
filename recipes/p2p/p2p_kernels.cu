// Kernels of the P2P helper. Only the CUDA runtime is included, so this unit compiles in seconds.
#include <cuda_runtime.h>

#include "p2p.h"

namespace hermetic_p2p {

__global__ void copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n16,
                            unsigned char* __restrict__ dst_tail, const unsigned char* __restrict__ src_tail,
                            size_t tail) {
    size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n16; i += stride) {
        dst[i] = src[i];
    }
    if (blockIdx.x == 0 && threadIdx.x < tail) dst_tail[threadIdx.x] = src_tail[threadIdx.x];
}

__global__ void accumulate_kernel(float* __restrict__ acc, const float* __restrict__ part, size_t count) {
    size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
        acc[i] += part[i];
    }
}

static unsigned grid_for(size_t items) {
    size_t blocks = (items + 255) / 256;
    return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

int launch_local_copy(void* dst, const void* src, size_t bytes, std::intptr_t stream) {
    // 16-byte vector copies need 16-byte aligned pointers; anything else goes through the copy engine
    if ((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) % 16 != 0) {
        return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(stream));
    }
    size_t n16 = bytes / 16, tail = bytes % 16;
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    copy_kernel<<<grid_for(n16), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
        reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(s), n16, d + n16 * 16, s + n16 * 16, tail);
    return cudaGetLastError();
}

int launch_accumulate_f32(float* acc, const float* part, size_t count, std::intptr_t stream) {
    accumulate_kernel<<<grid_for(count), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(acc, part, count);
    return cudaGetLastError();
}

}  // namespace hermetic_p2p
