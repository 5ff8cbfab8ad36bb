#pragma once
// The NCCL backend of Communicator: CUDA tensors, collectives ordered on the
// current CUDA stream. Built when libtorch has CUDA and nccl.h is found
// (TPRUN_HAVE_NCCL); elsewhere nccl_compiled() is false and creating one is an
// error that says so.
//
// The communicator is bootstrapped through MPI (rank 0's ncclUniqueId is
// broadcast over the group's MPI communicator) and created non-blocking, so
// every wait polls ncclCommGetAsyncError with a deadline. Each enqueued
// collective records a CUDA event; the job's CommWatchdog polls the events and
// the communicator's async error and aborts the communicator (ncclCommAbort)
// and the job instead of hanging.

#include <memory>

#include "dist/communicator.h"

namespace tprun::dist {

class MpiCommunicator;
class CommWatchdog;

bool nccl_compiled();

// Collective over `bootstrap`'s group. `cuda_device` is this rank's device index.
std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, int cuda_device,
                                                     CommWatchdog* watchdog);

}  // namespace tprun::dist
