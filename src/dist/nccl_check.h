#pragma once
// Checked calls into NCCL, the twin of TPRUN_CUDA_CHECK (runtime/cuda_check.h):
//
//   TPRUN_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
//   TPRUN_NCCL_CHECK(ncclAllReduce(..., comm_, stream), comm_);
//   -> CommError "dist/nccl_communicator.cpp:88: ncclAllReduce(...) failed:
//      ncclInvalidArgument (invalid argument ...); last NCCL error: <ncclGetLastError(comm)>"
//
// The header needs no nccl.h (ncclSuccess is 0, ncclComm_t is a pointer to
// the incomplete struct ncclComm), so only the files that speak NCCL see it.

#include <string>

struct ncclComm;  // NCCL's opaque communicator (ncclComm_t is ncclComm*)

namespace tprun::dist {

// The failure of NCCL call `call` with result `code` (an ncclResult_t) as
// failed_call_message text: NCCL's name and text for the code, then
// `last_error` (ncclGetLastError) where it is non-empty. Needs no GPU.
std::string nccl_failure_text(const char* file, int line, const char* call, int code,
                              const char* last_error = nullptr);

// ncclGetLastError(comm), or nullptr for a null comm (or a build without NCCL).
const char* nccl_last_error(ncclComm* comm);

// Throws CommError with nccl_failure_text.
[[noreturn]] void throw_nccl_failure(const char* file, int line, const char* call, int code,
                                     const char* last_error);

}  // namespace tprun::dist

// `comm`: the communicator the call used (for ncclGetLastError), or nullptr.
#define TPRUN_NCCL_CHECK(call, comm)                                                              \
  do {                                                                                            \
    const int tprun_nccl_rc_ = static_cast<int>(call);                                            \
    if (tprun_nccl_rc_ != 0)                                                                      \
      ::tprun::dist::throw_nccl_failure(__FILE__, __LINE__, #call, tprun_nccl_rc_,                \
                                        ::tprun::dist::nccl_last_error(comm));                    \
  } while (0)
