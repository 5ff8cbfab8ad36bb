#pragma once
// How many threads a CPU rank runs, and whether the launcher's CPU binding
// starves it. Open MPI binds each rank to one core when it starts one or two
// ranks (to a socket for more) unless told otherwise, so a lone rank on a
// 64-core host would run one thread without a word: the node's first rank
// warns once with the fix. Under Slurm, --cpus-per-task (SLURM_CPUS_PER_TASK)
// gives the thread count. Pure functions over what the Session gathers, so
// the tests need no launcher.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/rank_env.h"

namespace tprun {

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; empty for text that is not such a list.
std::set<int> parse_cpu_list(const std::string& text);

// The CPUs this node's processes may use at all: the cgroup's cpuset
// (cpuset.cpus.effective) where there is one, else the online CPUs.
int node_cpus();

struct CpuBindingFacts {
  int node_cpus = 1;         // node_cpus()
  int rank_cpus = 1;         // CPUs in this rank's affinity mask
  int used_cpus = 1;         // CPUs in the union of the masks of this node's ranks
  int local_ranks = 1;       // ranks on this node
  bool open_mpi = false;     // started by Open MPI's mpirun (OMPI_COMM_WORLD_SIZE)
  bool launcher_bound = false;  // Open MPI bound the rank at launch (OMPI_MCA_orte_bound_at_launch=1)
  std::string binding_policy;   // OMPI_MCA_hwloc_base_binding_policy ("" = Open MPI's default)
  std::string mapping_policy;   // OMPI_MCA_rmaps_base_mapping_policy ("" = default)
};

// `local_masks`: the affinity masks (affinity_mask_string()) of this node's ranks.
CpuBindingFacts cpu_binding_facts(const EnvLookup& env, int node_cpu_count, int rank_cpus,
                                  const std::vector<std::string>& local_masks);

// The warning, when Open MPI's binding leaves at least half of the node's
// CPUs to no rank (ranks' CPUs x 2 <= node CPUs): what it bound, what it
// costs and the fix (`--bind-to none`, or `--map-by slot:PE=N`). nullopt
// when the binding uses the node, or was `--bind-to none`, or the launcher
// is not Open MPI.
std::optional<std::string> binding_warning(const CpuBindingFacts& facts);

struct ThreadChoice {
  int threads = 1;
  std::string reason;               // "--threads", "SLURM_CPUS_PER_TASK=8", "the affinity mask"
  std::optional<std::string> warning;  // --threads beyond the CPUs the rank may run on
};

// requested > 0: --threads (with a warning when it exceeds rank_cpus);
// else SLURM_CPUS_PER_TASK where set (at most rank_cpus); else rank_cpus
// shared fairly by the `sharing` local ranks with the same mask.
// ConfigError naming --threads for requested < 0, naming
// SLURM_CPUS_PER_TASK for a value that is not a positive integer.
ThreadChoice choose_threads(int requested, int rank_cpus, int sharing, const std::string& mask,
                            const EnvLookup& env);

}  // namespace tprun
