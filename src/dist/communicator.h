#pragma once
// One interface for the collectives of a process group (c10d's Backend in
// miniature). Backends: MpiCommunicator (CPU tensors) and NcclCommunicator
// (CUDA tensors, CUDA builds).
//
// Contract, for every method below:
//   * Every rank of the group calls the same collectives in the same order,
//     with tensors of the same dtype and shape (broadcast: on the root, the
//     source; elsewhere, a tensor of the same shape to fill).
//   * Calls block the host (MPI) or are ordered on the current CUDA stream
//     (NCCL); either way the result is ready for the next operation.
//   * A collective that does not complete within the job's communication
//     timeout, or fails on any rank, ends the whole job with a message; it
//     never hangs.
//   * Results are bitwise identical on every rank of the group.

#include <cstdint>
#include <string>

#include "dist/collective_stats.h"

namespace at {
class Tensor;
}

namespace tprun::dist {

enum class ReduceOp { Sum, Max };

struct AllReduceOptions {
  ReduceOp op = ReduceOp::Sum;
};

struct AllGatherOptions {
  int64_t dim = 0;  // concatenate the ranks' tensors along this dimension
};

struct BroadcastOptions {
  int root = 0;  // rank within this group
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual const char* backend() const = 0;  // "mpi", "nccl"
  virtual int rank() const = 0;             // this process's rank in the group
  virtual int size() const = 0;
  const std::string& name() const { return name_; }  // "world", "tp[1]", "dp[0]"

  // In place: tensor = op over the group. fp32, fp16, bf16 (accumulated in
  // fp32 for the 16-bit types), fp64 and integer types.
  virtual void all_reduce(at::Tensor& tensor, const AllReduceOptions& options = {}) = 0;
  // Returns the ranks' tensors concatenated along options.dim in rank order.
  virtual at::Tensor all_gather(const at::Tensor& tensor, const AllGatherOptions& options = {}) = 0;
  // In place: every rank's tensor becomes the root's.
  virtual void broadcast(at::Tensor& tensor, const BroadcastOptions& options = {}) = 0;
  virtual void barrier() = 0;

  const CollectiveStats& stats() const { return stats_; }
  void reset_stats() { stats_.reset(); }

 protected:
  explicit Communicator(std::string name) : name_(std::move(name)) {}
  CollectiveStats stats_;
  std::string name_;
};

}  // namespace tprun::dist
