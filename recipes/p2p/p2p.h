// The worker's peer-to-peer helper: declarations shared by the bindings and the CUDA kernels.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hermetic_p2p {

// Device-local copy and accumulate on a stream (kernels in p2p_kernels.cu). Return a cudaError_t value.
int launch_local_copy(void* dst, const void* src, size_t bytes, std::intptr_t stream);
int launch_accumulate_f32(float* acc, const float* part, size_t count, std::intptr_t stream);

}  // namespace hermetic_p2p
