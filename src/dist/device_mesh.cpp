#include "dist/device_mesh.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "dist/mpi_communicator.h"
#include "dist/mpi_world.h"
#include "dist/nccl_communicator.h"
#include "dist/staged_mpi_communicator.h"
#include "runtime/error.h"

namespace tprun::dist {

std::optional<CommChoice> comm_choice_from_name(const std::string& name) {
  if (name == "auto") return CommChoice::Auto;
  if (name == "nccl") return CommChoice::Nccl;
  if (name == "mpi") return CommChoice::Mpi;
  return std::nullopt;
}

const char* comm_choice_name(CommChoice choice) {
  switch (choice) {
    case CommChoice::Auto: return "auto";
    case CommChoice::Nccl: return "nccl";
    case CommChoice::Mpi: return "mpi";
  }
  return "?";
}

namespace {

bool use_nccl(CommChoice comm) { return comm == CommChoice::Nccl || (comm == CommChoice::Auto && nccl_compiled()); }

// The TP group's communicator for CUDA tensors, as `ctx.comm` asks.
std::unique_ptr<Communicator> make_tp_cuda_communicator(MpiCommunicator& tp, const MeshContext& ctx) {
  if (ctx.comm == CommChoice::Nccl && !nccl_compiled()) {
    throw ConfigError("--comm nccl: this tprun was built without NCCL (libtorch without CUDA, or nccl.h not "
                      "found at configure time); use --comm mpi or --comm auto",
                      true);
  }
  if (use_nccl(ctx.comm)) {
    return make_nccl_communicator(tp, ctx.cuda_device, ctx.watchdog);
  }
  // A communicator of its own (a duplicate of the TP group's), so that its
  // traffic and counters stay apart from the CPU communicator's.
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(tp.handle(), &dup), "MPI_Comm_dup(tp)");
  return std::make_unique<StagedMpiCommunicator>(std::make_unique<MpiCommunicator>(dup, tp.name(), ctx.watchdog));
}

}  // namespace

const char* tp_device_backend(const MeshContext& ctx) {
  if (ctx.cuda_device < 0) return "mpi";
  return use_nccl(ctx.comm) ? "nccl" : "mpi-staged";
}

std::unique_ptr<DeviceMesh> DeviceMesh::create(const MeshSpec& spec, const MeshContext& ctx) {
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh());
  int world = 1;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &mesh->world_rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world), "MPI_Comm_size");
  mesh->node_of_rank_ = mpi_node_of_rank();
  mesh->layout_ = plan_mesh(world, spec, mesh->node_of_rank_);
  const MeshCoord c = mesh->layout_.coord(mesh->world_rank_);

  mesh->world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", ctx.watchdog);
  MPI_Comm tp_comm = MPI_COMM_NULL;
  MPI_Comm dp_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, c.dp_index, c.tp_index, &tp_comm), "MPI_Comm_split(tp)");
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, c.tp_index, c.dp_index, &dp_comm), "MPI_Comm_split(dp)");
  mesh->tp_ = std::make_unique<MpiCommunicator>(tp_comm, fmt::format("tp[{}]", c.dp_index), ctx.watchdog);
  mesh->dp_ = std::make_unique<MpiCommunicator>(dp_comm, fmt::format("dp[{}]", c.tp_index), ctx.watchdog);
  if (ctx.cuda_device >= 0) mesh->tp_cuda_ = make_tp_cuda_communicator(*mesh->tp_, ctx);
  if (mesh->layout_.group_spans_nodes[static_cast<size_t>(c.dp_index)]) {
    spdlog::warn("tp group {} spans nodes (allow_cross_node_tp): every layer's AllReduce crosses "
                 "the network",
                 format_ranks(mesh->layout_.tp_group_of(mesh->world_rank_)));
  }
  spdlog::debug("mesh: dp {} x tp {}; this rank dp {} tp {} group {}, tp backend {}", mesh->layout_.dp,
                mesh->layout_.tp, c.dp_index, c.tp_index,
                format_ranks(mesh->layout_.tp_group_of(mesh->world_rank_)), mesh->tp_device().backend());
  return mesh;
}

DeviceMesh::~DeviceMesh() = default;

Communicator& DeviceMesh::world() { return *world_; }
Communicator& DeviceMesh::tp() { return *tp_; }
Communicator& DeviceMesh::dp() { return *dp_; }
Communicator& DeviceMesh::tp_device() { return tp_cuda_ ? *tp_cuda_ : static_cast<Communicator&>(*tp_); }

}  // namespace tprun::dist
