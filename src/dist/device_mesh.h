#pragma once
// The device mesh made real: MPI sub-communicators for this rank's TP group
// and its DP peers (plus a device communicator for the TP group on CUDA ranks,
// the only group that reduces device tensors: NCCL, or MPI staged through
// pinned host memory).

#include <memory>
#include <optional>
#include <string>

#include "dist/communicator.h"
#include "dist/mesh.h"

namespace tprun::dist {

class CommWatchdog;
class MpiCommunicator;

// The TP group's backend for CUDA tensors (`--comm`). CPU ranks always use MPI.
enum class CommChoice {
  Auto,  // NCCL where this build has it, else MPI staged through host memory
  Nccl,  // NCCL; a ConfigError in a build without it
  Mpi,   // MPI staged through pinned host memory (StagedMpiCommunicator); works
         // with several ranks on one GPU, which NCCL refuses
};

// "auto", "nccl", "mpi" (and back); nullopt for any other name.
std::optional<CommChoice> comm_choice_from_name(const std::string& name);
const char* comm_choice_name(CommChoice choice);

struct MeshContext {
  int cuda_device = -1;                // >= 0: build a device communicator on this device
  CommChoice comm = CommChoice::Auto;  // which one, on a CUDA rank
  CommWatchdog* watchdog = nullptr;    // deadline for collectives (may be null)
};

// The backend DeviceMesh::tp_device() gets for `ctx`: "mpi" on a CPU rank,
// else "nccl" or "mpi-staged" (for the startup log, before the mesh exists).
const char* tp_device_backend(const MeshContext& ctx);

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
  // The communicator for tensors on this rank's compute device: on a CUDA
  // rank NCCL or the staged MPI backend (MeshContext::comm), else the MPI one.
  Communicator& tp_device();

 private:
  DeviceMesh() = default;
  MeshLayout layout_;
  int world_rank_ = 0;
  std::vector<int> node_of_rank_;
  std::unique_ptr<MpiCommunicator> world_, tp_, dp_;
  std::unique_ptr<Communicator> tp_cuda_;
};

}  // namespace tprun::dist
