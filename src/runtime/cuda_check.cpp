#include "runtime/cuda_check.h"

#include <cstring>

#include <fmt/format.h>

#ifdef TPRUN_TORCH_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tprun {

std::string failed_call_message(const char* file, int line, const char* call, const std::string& text) {
  std::string where = file != nullptr ? file : "?";
  const size_t src = where.rfind("/src/");
  if (src != std::string::npos) {
    where = where.substr(src + 5);
  } else if (where.rfind("src/", 0) == 0) {
    where = where.substr(4);
  } else if (const size_t slash = where.rfind('/'); slash != std::string::npos) {
    where = where.substr(slash + 1);
  }
  return fmt::format("{}:{}: {} failed: {}", where, line, clip_text(call != nullptr ? call : "?", 160), text);
}

#ifdef TPRUN_TORCH_HAS_CUDA
std::string cuda_failure_text(const char* file, int line, const char* call, int code) {
  const auto rc = static_cast<cudaError_t>(code);
  const char* name = cudaGetErrorName(rc);
  const char* text = cudaGetErrorString(rc);
  return failed_call_message(file, line, call,
                             fmt::format("{} ({})", name != nullptr ? name : "cudaError?",
                                         text != nullptr ? text : "unknown CUDA error"));
}

void throw_cuda_failure(const char* file, int line, const char* call, int code) {
  std::string message = cuda_failure_text(file, line, call, code);
  // A non-sticky error stays in CUDA's last-error slot until read; reading it
  // here keeps it from being reported again by an unrelated later call.
  (void)cudaGetLastError();
  throw DeviceError(message);
}
#endif

}  // namespace tprun
