// Checked CUDA runtime calls: every CUDA call's error comes back as a Status that names the
// call, the file and line it came from, and CUDA's own name and text for the error, e.g.
//   "internal: CUDA error cudaErrorMemoryAllocation (out of memory) in cudaMalloc(&p, n)
//    at src/kernels_cuda/attention.cu:120"  (one line)
//
// Header only, and only for targets built with DISTCA_CUDA=ON (it includes the CUDA runtime
// headers; link distca::cuda). Host code only. Other CUDA libraries (cuBLAS, NCCL) follow the
// same pattern with their own error-string function: build the message with
// distca::cuda_error_status's format and return it.
//
// Thread safety: pure functions; cudaGetLastError() in DISTCA_CUDA_CHECK_LAUNCH reads (and
// clears) the calling host thread's last error only.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "distca/core/status.h"

namespace distca {

// OK for cudaSuccess; otherwise Status::internal with "CUDA error NAME (TEXT) in WHAT at
// FILE:LINE". cudaErrorNoDevice and cudaErrorInsufficientDriver (a machine without a GPU or
// driver) keep the same code: callers that want to skip test for cuda_no_device().
inline Status cuda_error_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return {};
  return Status::internal(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                          ") in " + what + " at " + file + ":" + std::to_string(line));
}

// True for the errors a machine without a usable GPU gives (no device, no or old driver).
inline bool cuda_no_device(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError;
}

}  // namespace distca

// DISTCA_CUDA_CHECK(cudaMemcpyAsync(...)): returns the Status from the enclosing function (which
// returns Status or Result<T>) if the call fails.
#define DISTCA_CUDA_CHECK(call)                                                                  \
  do {                                                                                           \
    const cudaError_t distca_cuda_err_ = (call);                                                 \
    if (distca_cuda_err_ != cudaSuccess) {                                                       \
      return ::distca::cuda_error_status(distca_cuda_err_, #call, __FILE__, __LINE__);           \
    }                                                                                            \
  } while (0)

// After a <<<...>>> launch: a bad configuration is reported by cudaGetLastError(); `what` names
// the kernel. Asynchronous faults surface at the next synchronising call's check.
#define DISTCA_CUDA_CHECK_LAUNCH(what)                                                           \
  do {                                                                                           \
    const cudaError_t distca_cuda_err_ = cudaGetLastError();                                     \
    if (distca_cuda_err_ != cudaSuccess) {                                                       \
      return ::distca::cuda_error_status(distca_cuda_err_, "launch of " what, __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)
