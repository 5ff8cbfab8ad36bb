#include "runtime/rank_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun {
namespace {

// Parses a non-negative integer variable; nullopt when unset.
std::optional<int> int_var(const EnvLookup& env, const std::string& name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  const std::string& s = *value;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || end == s.c_str() || *end != '\0' || errno == ERANGE || v < 0 ||
      v > INT_MAX) {
    throw ConfigError(fmt::format(
        "environment variable {}='{}' is not a non-negative integer; fix or unset it", name, clip_text(s)));
  }
  return static_cast<int>(v);
}

// A count of ranks (a world or a node's share of it): int_var, at most kMaxWorld.
std::optional<int> size_var(const EnvLookup& env, const std::string& name) {
  auto v = int_var(env, name);
  if (v && *v > kMaxWorld) {
    throw ConfigError(fmt::format("environment variable {}={} is more ranks than tprun supports (at most {}); fix "
                                  "or unset it",
                                  name, *v, kMaxWorld));
  }
  return v;
}

// A decimal count of at most 9 digits in list[i, j), or -1.
int small_count(const std::string& list, size_t i, size_t j) {
  if (j <= i || j - i > 9) return -1;
  int v = 0;
  for (size_t k = i; k < j; ++k) v = v * 10 + (list[k] - '0');
  return v;
}

void check_consistent(const RankEnv& r, const std::string& rank_var,
                      const std::string& world_var) {
  if (r.world < 1) {
    throw ConfigError(fmt::format("{} is {}: a job needs at least one rank", world_var, r.world));
  }
  if (r.rank >= r.world) {
    throw ConfigError(fmt::format("{}={} is not below {}={}", rank_var, r.rank, world_var, r.world));
  }
  if (r.local_size > 0 && r.local_rank >= r.local_size) {
    throw ConfigError(fmt::format("local rank {} is not below local size {} ({})", r.local_rank,
                                  r.local_size, r.source));
  }
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

int slurm_tasks_on_node(const std::string& list, int node_id) {
  // Grammar: entry ("," entry)*; entry = count | count "(x" repeat ")".
  std::vector<int> expanded;
  size_t i = 0;
  while (i < list.size()) {
    size_t j = i;
    while (j < list.size() && list[j] >= '0' && list[j] <= '9') ++j;
    if (j == i) return -1;
    const int count = small_count(list, i, j);
    if (count < 0) return -1;
    int repeat = 1;
    if (j < list.size() && list[j] == '(') {
      if (j + 1 >= list.size() || list[j + 1] != 'x') return -1;
      size_t k = j + 2;
      size_t close = list.find(')', k);
      if (close == std::string::npos || close == k) return -1;
      for (size_t c = k; c < close; ++c)
        if (list[c] < '0' || list[c] > '9') return -1;
      repeat = small_count(list, k, close);
      if (repeat < 0) return -1;
      j = close + 1;
    }
    for (int r = 0; r < repeat && static_cast<int>(expanded.size()) <= node_id; ++r)
      expanded.push_back(count);
    if (j < list.size()) {
      if (list[j] != ',') return -1;
      ++j;
    }
    i = j;
  }
  if (node_id < 0 || node_id >= static_cast<int>(expanded.size())) return -1;
  return expanded[static_cast<size_t>(node_id)];
}

std::optional<RankEnv> rank_env_from_variables(const EnvLookup& env) {
  // 1. Open MPI's launcher.
  if (auto rank = int_var(env, "OMPI_COMM_WORLD_RANK")) {
    auto world = size_var(env, "OMPI_COMM_WORLD_SIZE");
    if (world) {
      RankEnv r;
      r.rank = *rank;
      r.world = *world;
      r.local_rank = int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
      r.local_size = size_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(-1);
      r.source = "OMPI_COMM_WORLD_*";
      check_consistent(r, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
      return r;
    }
  }
  // 2. Slurm's srun. SLURM_PROCID alone is also set in the batch script's own
  // shell; SLURM_NTASKS together with SLURM_LOCALID marks a task of srun.
  if (auto rank = int_var(env, "SLURM_PROCID")) {
    auto world = size_var(env, "SLURM_NTASKS");
    auto local = int_var(env, "SLURM_LOCALID");
    if (world && local) {
      RankEnv r;
      r.rank = *rank;
      r.world = *world;
      r.local_rank = *local;
      r.local_size = -1;
      auto node = int_var(env, "SLURM_NODEID");
      auto tasks = env("SLURM_TASKS_PER_NODE");
      if (node && tasks) r.local_size = slurm_tasks_on_node(*tasks, *node);
      if (r.local_size > kMaxWorld) {
        throw ConfigError(fmt::format("environment variable SLURM_TASKS_PER_NODE='{}' gives node {} {} tasks, more "
                                      "ranks than tprun supports (at most {}); fix or unset it",
                                      clip_text(*tasks), *node, r.local_size, kMaxWorld));
      }
      r.source = "SLURM_*";
      check_consistent(r, "SLURM_PROCID", "SLURM_NTASKS");
      return r;
    }
  }
  // 3. torchrun-style variables.
  if (auto rank = int_var(env, "RANK")) {
    auto world = size_var(env, "WORLD_SIZE");
    if (world) {
      RankEnv r;
      r.rank = *rank;
      r.world = *world;
      r.local_rank = int_var(env, "LOCAL_RANK").value_or(0);
      r.local_size = size_var(env, "LOCAL_WORLD_SIZE").value_or(-1);
      r.source = "RANK/WORLD_SIZE";
      check_consistent(r, "RANK", "WORLD_SIZE");
      return r;
    }
  }
  return std::nullopt;
}

RankEnv resolve_rank_env(const EnvLookup& env, const MpiIdentity& mpi) {
  if (mpi.world > kMaxWorld) {
    throw ConfigError(fmt::format("MPI started {} ranks; tprun supports at most {}: start fewer ranks", mpi.world,
                                  kMaxWorld),
                      true);
  }
  auto from_vars = rank_env_from_variables(env);
  if (!from_vars) {
    RankEnv r;
    r.rank = mpi.rank;
    r.world = mpi.world;
    r.local_rank = mpi.local_rank;
    r.local_size = mpi.local_size;
    r.source = "MPI";
    return r;
  }
  RankEnv r = *from_vars;
  if (r.world != mpi.world || r.rank != mpi.rank) {
    throw ConfigError(fmt::format(
        "{} says rank {} of {}, but MPI sees rank {} of {}: tprun communicates through MPI, "
        "so start it with mpirun or srun (srun --mpi=pmix), or unset the stale variables",
        r.source, r.rank, r.world, mpi.rank, mpi.world));
  }
  if (r.local_size < 0) r.local_size = mpi.local_size;
  return r;
}

}  // namespace tprun
