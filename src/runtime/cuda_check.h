#pragma once
// Checked calls into the CUDA runtime. Every CUDA call tprun makes goes
// through TPRUN_CUDA_CHECK, which throws tprun::DeviceError naming the source
// file, the line and the call as written, with CUDA's own error name and text:
//
//   TPRUN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
//   -> "checkpoint/cuda_copy_engine.cpp:57: cudaMemcpyAsync(dst, src, n, ...) failed:
//       cudaErrorInvalidValue (invalid argument)"
//
// NCCL calls have their twin in dist/nccl_check.h. The header needs no CUDA
// header (cudaSuccess is 0 in every CUDA version), so a file that only checks
// calls keeps <cuda_runtime.h> to itself; the macro exists only in builds
// whose libtorch has CUDA.

#include <string>

#include "runtime/error.h"

namespace tprun {

// "<file>:<line>: <call> failed: <text>", the file shortened to its path below
// src/ (or its base name), the call clipped to 160 characters.
std::string failed_call_message(const char* file, int line, const char* call, const std::string& text);

#ifdef TPRUN_TORCH_HAS_CUDA
// Throws DeviceError for CUDA error `code` (a cudaError_t) from `call`; clears
// CUDA's last-error state so that a later, unrelated check does not see it.
[[noreturn]] void throw_cuda_failure(const char* file, int line, const char* call, int code);
// The same error as text, without throwing (destructors and watchdog polls).
std::string cuda_failure_text(const char* file, int line, const char* call, int code);

#define TPRUN_CUDA_CHECK(call)                                                            \
  do {                                                                                    \
    const int tprun_cuda_rc_ = static_cast<int>(call);                                    \
    if (tprun_cuda_rc_ != 0) ::tprun::throw_cuda_failure(__FILE__, __LINE__, #call, tprun_cuda_rc_); \
  } while (0)
#endif

}  // namespace tprun
