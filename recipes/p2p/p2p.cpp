// The worker's peer-to-peer helper: peer-access query and enable, peer and device-local copies on a stream,
// and a CPU path, so the worker runs on any machine. Nothing here touches CUDA at import time: a context is
// created only when a CUDA function is first called.
#include <torch/extension.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "p2p.h"

namespace {

void check(int err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void check_pair(const torch::Tensor& dst, const torch::Tensor& src) {
    TORCH_CHECK(dst.is_contiguous() && src.is_contiguous(), "p2p: tensors must be contiguous");
    TORCH_CHECK(dst.nbytes() == src.nbytes(), "p2p: size mismatch: ", dst.nbytes(), " vs ", src.nbytes());
}

int device_count() {
    int n = 0;
    // no driver or no device: zero devices, not an error (the CPU path still works)
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool can_access_peer(int device, int peer) {
    int ok = 0;
    check(cudaDeviceCanAccessPeer(&ok, device, peer), "cudaDeviceCanAccessPeer");
    return ok != 0;
}

bool enable_peer_access(int device, int peer) {
    if (!can_access_peer(device, peer)) return false;
    int previous = 0;
    check(cudaGetDevice(&previous), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clear the sticky "already enabled" so later checks do not see it
        err = cudaSuccess;
    }
    cudaSetDevice(previous);
    check(err, "cudaDeviceEnablePeerAccess");
    return true;
}

// Copy between two devices (through peer access when enabled, else staged by the driver) on `stream`.
void peer_copy(torch::Tensor dst, torch::Tensor src, std::intptr_t stream) {
    check_pair(dst, src);
    TORCH_CHECK(dst.is_cuda() && src.is_cuda(), "peer_copy: both tensors must be on CUDA devices");
    check(cudaMemcpyPeerAsync(dst.data_ptr(), dst.get_device(), src.data_ptr(), src.get_device(), src.nbytes(),
                              reinterpret_cast<cudaStream_t>(stream)),
          "cudaMemcpyPeerAsync");
}

// Copy within one device with our own kernel, on `stream`.
void local_copy(torch::Tensor dst, torch::Tensor src, std::intptr_t stream) {
    check_pair(dst, src);
    TORCH_CHECK(dst.is_cuda() && src.is_cuda() && dst.get_device() == src.get_device(),
                "local_copy: both tensors must be on the same CUDA device");
    check(hermetic_p2p::launch_local_copy(dst.data_ptr(), src.data_ptr(), src.nbytes(), stream), "local_copy");
}

void cpu_copy(torch::Tensor dst, torch::Tensor src) {
    check_pair(dst, src);
    TORCH_CHECK(!dst.is_cuda() && !src.is_cuda(), "cpu_copy: both tensors must be on the CPU");
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
}

// acc += part: where a pair of ranks would all-reduce, the two partial results are summed.
void accumulate(torch::Tensor acc, torch::Tensor part, std::intptr_t stream) {
    check_pair(acc, part);
    TORCH_CHECK(acc.scalar_type() == torch::kFloat32 && part.scalar_type() == torch::kFloat32,
                "accumulate: float32 tensors only");
    if (!acc.is_cuda()) {
        TORCH_CHECK(!part.is_cuda(), "accumulate: both tensors on the CPU or both on one device");
        float* a = acc.data_ptr<float>();
        const float* p = part.data_ptr<float>();
        for (int64_t i = 0, n = acc.numel(); i < n; ++i) a[i] += p[i];
        return;
    }
    TORCH_CHECK(part.is_cuda() && part.get_device() == acc.get_device(), "accumulate: tensors on one device");
    check(hermetic_p2p::launch_accumulate_f32(acc.data_ptr<float>(), part.data_ptr<float>(), acc.numel(), stream),
          "accumulate");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "hermetic's peer-to-peer helper for the reference worker";
    m.def("device_count", &device_count, "CUDA devices visible (0 without a driver)");
    m.def("can_access_peer", &can_access_peer, "whether `device` can access `peer`'s memory directly");
    m.def("enable_peer_access", &enable_peer_access, "enable device -> peer access; False when unsupported");
    m.def("peer_copy", &peer_copy, "copy src to dst across devices on a stream", py::arg("dst"), py::arg("src"),
          py::arg("stream") = 0);
    m.def("local_copy", &local_copy, "device-local copy on a stream (our kernel)", py::arg("dst"), py::arg("src"),
          py::arg("stream") = 0);
    m.def("cpu_copy", &cpu_copy, "copy between CPU tensors", py::arg("dst"), py::arg("src"));
    m.def("accumulate", &accumulate, "acc += part (float32; CPU or one device)", py::arg("acc"), py::arg("part"),
          py::arg("stream") = 0);
}
