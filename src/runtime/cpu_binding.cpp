#include "runtime/cpu_binding.h"

#include <unistd.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "runtime/device.h"
#include "runtime/error.h"

namespace tprun {
namespace {

std::optional<std::string> first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::string t;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  }
  std::istringstream in(t);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto dash = part.find('-');
    const std::string a = part.substr(0, dash), b = dash == std::string::npos ? a : part.substr(dash + 1);
    if (!all_digits(a) || !all_digits(b)) return {};
    const int lo = std::stoi(a), hi = std::stoi(b);
    if (hi < lo || hi - lo > 1 << 16) return {};
    for (int i = lo; i <= hi; ++i) cpus.insert(i);
  }
  return cpus;
}

int node_cpus() {
  for (const char* path : {"/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus",
                           "/sys/fs/cgroup/cpuset/cpuset.cpus"}) {
    if (auto line = first_line(path)) {
      const auto cpus = parse_cpu_list(*line);
      if (!cpus.empty()) return static_cast<int>(cpus.size());
    }
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

CpuBindingFacts cpu_binding_facts(const EnvLookup& env, int node_cpu_count, int rank_cpus,
                                  const std::vector<std::string>& local_masks) {
  CpuBindingFacts f;
  f.node_cpus = std::max(1, node_cpu_count);
  f.rank_cpus = std::max(1, rank_cpus);
  f.local_ranks = std::max<int>(1, static_cast<int>(local_masks.size()));
  std::set<int> used;
  for (const auto& m : local_masks) {
    const auto cpus = parse_cpu_list(m);
    used.insert(cpus.begin(), cpus.end());
  }
  f.used_cpus = used.empty() ? f.rank_cpus : static_cast<int>(used.size());
  f.open_mpi = env("OMPI_COMM_WORLD_SIZE").has_value();
  f.launcher_bound = env("OMPI_MCA_orte_bound_at_launch").value_or("") == "1";
  f.binding_policy = env("OMPI_MCA_hwloc_base_binding_policy").value_or("");
  f.mapping_policy = env("OMPI_MCA_rmaps_base_mapping_policy").value_or("");
  return f;
}

std::optional<std::string> binding_warning(const CpuBindingFacts& f) {
  if (!f.open_mpi || f.binding_policy == "none") return std::nullopt;
  // Open MPI 4 says it bound the rank; a launcher that does not say so still
  // names a binding policy other than none.
  if (!f.launcher_bound && f.binding_policy.empty()) return std::nullopt;
  if (f.used_cpus * 2 > f.node_cpus) return std::nullopt;
  const int per_rank = std::max(1, f.node_cpus / f.local_ranks);
  return fmt::format(
      "CPU binding: Open MPI bound the {} rank(s) on this node to {} CPU(s) in all ({} per rank, binding {}), "
      "leaving {} of the node's {} CPUs idle: each rank runs {} thread(s). Launch with `mpirun --bind-to none` "
      "(the ranks then split the node's CPUs) or `mpirun --map-by slot:PE={}` ({} CPUs per rank)",
      f.local_ranks, f.used_cpus, f.rank_cpus,
      f.binding_policy.empty() ? std::string("Open MPI's default") : "--bind-to " + f.binding_policy,
      f.node_cpus - f.used_cpus, f.node_cpus, f.rank_cpus, per_rank, per_rank);
}

ThreadChoice choose_threads(int requested, int rank_cpus, int sharing, const std::string& mask,
                            const EnvLookup& env) {
  ThreadChoice c;
  if (requested < 0) throw ConfigError(fmt::format("--threads {} must be at least 1 (0 = automatic)", requested));
  rank_cpus = std::max(1, rank_cpus);
  if (requested > 0) {
    c.threads = requested;
    c.reason = "--threads";
    if (requested > rank_cpus) {
      c.warning = fmt::format(
          "--threads {} exceeds the {} CPU(s) this rank may run on (CPUs {}): its threads will take turns on "
          "them; pass --threads {} or less, or widen the binding (`mpirun --bind-to none`, `srun "
          "--cpus-per-task`)",
          requested, rank_cpus, mask, rank_cpus);
    }
    return c;
  }
  if (auto cpt = env("SLURM_CPUS_PER_TASK")) {
    if (!all_digits(*cpt) || std::stoi(*cpt) < 1) {
      throw ConfigError(fmt::format("SLURM_CPUS_PER_TASK='{}' is not a positive integer", *cpt));
    }
    c.threads = std::min(std::stoi(*cpt), rank_cpus);
    c.reason = fmt::format("SLURM_CPUS_PER_TASK={}", *cpt);
    return c;
  }
  c.threads = cpu_threads_for_rank(rank_cpus, sharing);
  c.reason = "the affinity mask";
  return c;
}

}  // namespace tprun
