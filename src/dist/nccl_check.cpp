#include "dist/nccl_check.h"

#include <fmt/format.h>

#include "runtime/cuda_check.h"
#include "runtime/error.h"

#ifdef TPRUN_HAVE_NCCL
#include <nccl.h>
#endif

namespace tprun::dist {
namespace {

// NCCL gives text for a code but no name; the name is what users search for.
const char* nccl_result_name(int code) {
  switch (code) {
    case 0: return "ncclSuccess";
    case 1: return "ncclUnhandledCudaError";
    case 2: return "ncclSystemError";
    case 3: return "ncclInternalError";
    case 4: return "ncclInvalidArgument";
    case 5: return "ncclInvalidUsage";
    case 6: return "ncclRemoteError";
    case 7: return "ncclInProgress";
    default: return "ncclResult?";
  }
}

}  // namespace

std::string nccl_failure_text(const char* file, int line, const char* call, int code, const char* last_error) {
#ifdef TPRUN_HAVE_NCCL
  const char* text = ncclGetErrorString(static_cast<ncclResult_t>(code));
#else
  const char* text = nullptr;
#endif
  std::string what = fmt::format("{} ({})", nccl_result_name(code),
                                 text != nullptr && *text != '\0' ? text : fmt::format("NCCL error {}", code));
  if (last_error != nullptr && *last_error != '\0') what += fmt::format("; last NCCL error: {}", last_error);
  return failed_call_message(file, line, call, what);
}

const char* nccl_last_error(ncclComm* comm) {
#ifdef TPRUN_HAVE_NCCL
  if (comm != nullptr) return ncclGetLastError(comm);
#endif
  return nullptr;
}

void throw_nccl_failure(const char* file, int line, const char* call, int code, const char* last_error) {
  throw CommError(nccl_failure_text(file, line, call, code, last_error));
}

}  // namespace tprun::dist
