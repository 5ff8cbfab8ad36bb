#pragma once
// The MPI backend for tensors on a CUDA device: each collective copies the
// CUDA tensor into pinned host memory, runs the MPI collective on the host
// copy (MpiCommunicator) and copies the result back. Slower than NCCL, but it
// works where NCCL cannot: NCCL refuses two ranks on one GPU, and builds
// without NCCL have no other way to reduce device tensors (`--comm mpi`).
//
// CPU tensors go to the MPI communicator unchanged. The pinned buffer is
// reused between calls and grows only for a larger tensor; it holds one
// tensor at a time (an all_gather's result is copied back from the MPI
// communicator's own host tensor). Copies run on the tensor's current CUDA
// stream and the host waits for each: the collective blocks the host anyway,
// and the buffer is then free for the next call as soon as this one returns.

#include <cstddef>
#include <memory>

#include "dist/communicator.h"

namespace tprun::dist {

class MpiCommunicator;

class StagedMpiCommunicator final : public Communicator {
 public:
  // Takes the communicator over (its name becomes this one's). Statistics
  // are this communicator's own: one record per call, CPU or CUDA.
  explicit StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> mpi);
  ~StagedMpiCommunicator() override;

  const char* backend() const override { return "mpi-staged"; }
  int rank() const override;
  int size() const override;

  void all_reduce(at::Tensor& tensor, const AllReduceOptions& options = {}) override;
  at::Tensor all_gather(const at::Tensor& tensor, const AllGatherOptions& options = {}) override;
  void broadcast(at::Tensor& tensor, const BroadcastOptions& options = {}) override;
  void barrier() override;

  // Bytes of pinned host memory held now (0 until a CUDA tensor was staged).
  size_t staging_bytes() const { return capacity_; }

 private:
  // A CPU tensor shaped like `like` over the pinned buffer, grown if needed.
  at::Tensor host_view(const at::Tensor& like);

  std::unique_ptr<MpiCommunicator> mpi_;
  void* pinned_ = nullptr;  // cudaHostAlloc'ed, capacity_ bytes
  size_t capacity_ = 0;
};

}  // namespace tprun::dist
