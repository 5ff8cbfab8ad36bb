#pragma once
// The device mesh made real: MPI sub-communicators for this rank's TP group
// and its DP peers (plus an NCCL communicator for the TP group on CUDA ranks:
// the only group that reduces device tensors).

#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/mesh.h"

namespace tprun::dist {

class CommWatchdog;
class MpiCommunicator;

struct MeshContext {
  int cuda_device = -1;                // >= 0: build NCCL communicators on this device
  CommWatchdog* watchdog = nullptr;    // deadline for collectives (may be null)
};

class DeviceMesh {
 public:
  // Collective over MPI_COMM_WORLD: gathers the node of every rank, plans the
  // layout (ConfigError on every rank when it does not fit) and splits the
  // world into TP and DP communicators.
  static std::unique_ptr<DeviceMesh> create(const MeshSpec& spec, const MeshContext& ctx);
  ~DeviceMesh();

  const MeshLayout& layout() const { return layout_; }
  int world_rank() const { return world_rank_; }
  int tp_rank() const { return layout_.coord(world_rank_).tp_index; }
  int dp_rank() const { return layout_.coord(world_rank_).dp_index; }
  int tp_size() const { return layout_.tp; }
  int dp_size() const { return layout_.dp; }
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }

  // MPI communicators (CPU tensors, metadata, verdicts).
  Communicator& world();
  Communicator& tp();
  Communicator& dp();
  // The communicator for tensors on this rank's compute device: NCCL on a
  // CUDA rank, else the MPI one.
  Communicator& tp_device();

 private:
  DeviceMesh() = default;
  MeshLayout layout_;
  int world_rank_ = 0;
  std::vector<int> node_of_rank_;
  std::unique_ptr<MpiCommunicator> world_, tp_, dp_;
  std::unique_ptr<Communicator> tp_nccl_;
};

}  // namespace tprun::dist
