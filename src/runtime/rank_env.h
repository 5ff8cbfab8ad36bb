#pragma once
// Where a rank learns who it is: launcher environment variables first, MPI
// itself last. Precedence (SPEC §1):
//   1. Open MPI   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   2. Slurm      SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID
//                 (local size from SLURM_TASKS_PER_NODE and SLURM_NODEID)
//   3. torchrun   RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE
//   4. MPI        MPI_Comm_rank / MPI_Comm_size / a shared-memory split

#include <functional>
#include <optional>
#include <string>

namespace tprun {

// The most ranks a job may have: every world (a launcher's variables, MPI's
// own, `tprun plan --world`) and every TP size is refused above it, so the
// per-rank tables and loops stay bounded.
constexpr int kMaxWorld = 65536;

struct RankEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_size = -1;  // -1: the source does not say; filled from MPI
  std::string source;   // "OMPI_COMM_WORLD_*", "SLURM_*", "RANK/WORLD_SIZE", "MPI"
};

// What MPI itself reports for this process (see dist/mpi_world.h).
struct MpiIdentity {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_size = 1;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The process environment, through getenv.
EnvLookup process_env();

// The first launcher whose variables are all present, or nullopt. A variable
// that is present but malformed (not an integer, out of range; a size above
// kMaxWorld) is a ConfigError naming the variable and its value.
std::optional<RankEnv> rank_env_from_variables(const EnvLookup& env);

// Combines the launcher variables with what MPI reports. The variables win for
// the local rank (device choice); MPI must agree on rank and world, since
// communication goes through MPI: a disagreement is a ConfigError that names
// both and what to do. An MPI world above kMaxWorld is a ConfigError.
RankEnv resolve_rank_env(const EnvLookup& env, const MpiIdentity& mpi);

// Expands Slurm's compressed task list ("2(x3),1") and returns the entry for
// node `node_id`, or -1 when the list is malformed or too short.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

}  // namespace tprun
