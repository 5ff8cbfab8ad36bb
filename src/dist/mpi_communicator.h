#pragma once
// The MPI backend of Communicator: CPU tensors over an MPI communicator.

#include <mpi.h>

#include "dist/communicator.h"

namespace tprun::dist {

class CommWatchdog;

class MpiCommunicator final : public Communicator {
 public:
  // Owns `comm` (MPI_Comm_free in the destructor) unless it is MPI_COMM_WORLD.
  // `watchdog` may be null (no deadline).
  MpiCommunicator(MPI_Comm comm, std::string name, CommWatchdog* watchdog);
  ~MpiCommunicator() override;

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm handle() const { return comm_; }

  void all_reduce(at::Tensor& tensor, const AllReduceOptions& options = {}) override;
  at::Tensor all_gather(const at::Tensor& tensor, const AllGatherOptions& options = {}) override;
  void broadcast(at::Tensor& tensor, const BroadcastOptions& options = {}) override;
  void barrier() override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  CommWatchdog* watchdog_;
};

}  // namespace tprun::dist
