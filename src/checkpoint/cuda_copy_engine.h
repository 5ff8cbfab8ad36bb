#pragma once
// The CopyEngine of CUDA devices (pinned_staging.h): staging buffers pinned
// with cudaHostAlloc, copies on a non-blocking stream of their own so they
// overlap both the next slice's read and the compute stream, one event per
// copy for the host to wait on and for the compute stream to queue behind.

#include <memory>

#include "checkpoint/pinned_staging.h"

namespace tprun::checkpoint {

// The engine for CUDA device `device` (-1: the current device). DeviceError
// in a build without CUDA, or when the device cannot be used.
std::unique_ptr<CopyEngine> make_cuda_copy_engine(int device);

}  // namespace tprun::checkpoint
