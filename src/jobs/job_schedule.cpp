#include "jobs/job_schedule.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "lora/lora_choice.h"
#include "runtime/error.h"

namespace tprun::jobs {

std::vector<Unit> make_units(const std::vector<const JobRequest*>& todo, int64_t batch_size,
                             const std::function<std::optional<std::string>(const JobRequest&)>& batch_key) {
  std::vector<const JobRequest*> order = todo;
  std::sort(order.begin(), order.end(), [](const JobRequest* a, const JobRequest* b) { return a->id < b->id; });
  std::vector<Unit> units;
  std::map<std::string, size_t> open;  // key -> index of its unfilled batch
  for (const JobRequest* r : order) {
    const std::optional<std::string> key = batch_size > 1 ? batch_key(*r) : std::nullopt;
    if (!key) {
      units.push_back({r});
      continue;
    }
    auto it = open.find(*key);
    if (it == open.end() || static_cast<int64_t>(units[it->second].size()) >= batch_size) {
      open[*key] = units.size();
      units.push_back({r});
    } else {
      units[it->second].push_back(r);
    }
  }
  return units;
}

std::vector<std::vector<Unit>> assign_units(std::vector<Unit> units, int replicas,
                                            const std::function<double(const JobRequest&)>& cost) {
  auto unit_cost = [&](const Unit& u) {
    double c = 0;
    for (const JobRequest* r : u) c += cost(*r);
    return c;
  };
  std::vector<double> costs;
  std::vector<size_t> order(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    order[i] = i;
    costs.push_back(unit_cost(units[i]));
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (costs[a] != costs[b]) return costs[a] > costs[b];
    return units[a].front()->id < units[b].front()->id;
  });
  std::vector<double> load(static_cast<size_t>(replicas), 0.0);
  std::vector<std::vector<Unit>> out(static_cast<size_t>(replicas));
  for (size_t i : order) {
    const size_t best = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[best] += costs[i];
    out[best].push_back(std::move(units[i]));
  }
  return out;
}

void group_by_lora_set(std::vector<Unit>& units) {
  std::map<std::string, size_t> rank;  // set key -> order of its first unit
  std::vector<size_t> key_rank;
  for (const Unit& u : units) {
    const std::string key = u.empty() ? std::string() : lora::lora_set_key(u.front()->gen.lora_set());
    key_rank.push_back(rank.emplace(key, rank.size()).first->second);
  }
  std::vector<size_t> order(units.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key_rank[a] < key_rank[b]; });
  std::vector<Unit> sorted;
  sorted.reserve(units.size());
  for (size_t i : order) sorted.push_back(std::move(units[i]));
  units = std::move(sorted);
}

namespace {

// Decimal digits only, at most kMaxShardCount; nullopt otherwise (strtol would take a sign, leading
// space and wrap through a cast to int).
std::optional<long> shard_number(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  long x = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    x = x * 10 + (c - '0');
  }
  if (x > kMaxShardCount) return std::nullopt;
  return x;
}

struct SlurmArray {
  long index = 0;
  long count = 0;
};

// This task's chunk of a Slurm job array: its position among the array's task ids. `--array=0-10:2`
// runs ids 0, 2, ..., 10 (SLURM_ARRAY_TASK_STEP=2, COUNT=6), so the chunk is (ID - MIN) / STEP, and
// an id off the step, or an array whose ids are not evenly spaced (`--array=1,3,7`: MAX is not
// MIN + STEP * (COUNT - 1)), is refused naming the variables. STEP and MAX are optional (Slurm before
// 14.03 did not set them): STEP then counts as 1, and MAX is not checked.
SlurmArray slurm_array(const std::function<long(const char*)>& env_number) {
  const long id = env_number("SLURM_ARRAY_TASK_ID");
  const long min = env_number("SLURM_ARRAY_TASK_MIN");
  const long count = env_number("SLURM_ARRAY_TASK_COUNT");
  const char* step_text = std::getenv("SLURM_ARRAY_TASK_STEP");
  const long step = step_text && *step_text ? env_number("SLURM_ARRAY_TASK_STEP") : 1;
  if (step < 1) {
    throw ConfigError(fmt::format("--shard slurm: SLURM_ARRAY_TASK_STEP={} must be at least 1", step), true);
  }
  if (id < min || (id - min) % step != 0) {
    throw ConfigError(fmt::format("--shard slurm: SLURM_ARRAY_TASK_ID={} is not one of the array's ids "
                                  "SLURM_ARRAY_TASK_MIN={} + k * SLURM_ARRAY_TASK_STEP={}",
                                  id, min, step),
                      true);
  }
  const char* max_text = std::getenv("SLURM_ARRAY_TASK_MAX");
  if (max_text && *max_text && count >= 1) {
    const long max = env_number("SLURM_ARRAY_TASK_MAX");
    if (max != min + step * (count - 1)) {
      throw ConfigError(fmt::format("--shard slurm: the array's ids are not evenly spaced (SLURM_ARRAY_TASK_MIN={}, "
                                    "SLURM_ARRAY_TASK_MAX={}, SLURM_ARRAY_TASK_STEP={}, SLURM_ARRAY_TASK_COUNT={}: "
                                    "MIN + STEP * (COUNT - 1) is {}); submit --array=A-B or A-B:S, or pass "
                                    "--shard I/N yourself",
                                    min, max, step, count, min + step * (count - 1)),
                        true);
    }
  }
  return SlurmArray{(id - min) / step, count};
}

}  // namespace

ShardSpec parse_shard_spec(const std::string& text) {
  const std::string usage = fmt::format(
      "--shard '{}': expected I/N (decimal numbers, 0 <= I < N <= {}) or 'slurm'", text, kMaxShardCount);
  long index = 0, count = 0;
  if (text == "slurm") {
    auto env_number = [](const char* name) -> long {
      const char* v = std::getenv(name);
      if (!v || !*v) {
        throw ConfigError(fmt::format("--shard slurm: {} is not set (not a Slurm job array task)", name), true);
      }
      const auto x = shard_number(v);
      if (!x) {
        throw ConfigError(fmt::format("--shard slurm: {}='{}' is not a number from 0 to {}", name, v,
                                      kMaxShardCount),
                          true);
      }
      return *x;
    };
    const SlurmArray array = slurm_array(env_number);
    index = array.index;
    count = array.count;
  } else {
    const size_t slash = text.find('/');
    if (slash == std::string::npos) throw ConfigError(usage, true);
    const auto i = shard_number(text.substr(0, slash));
    const auto n = shard_number(text.substr(slash + 1));
    if (!i || !n) throw ConfigError(usage, true);
    index = *i;
    count = *n;
  }
  if (count < 1 || index < 0 || index >= count) {
    throw ConfigError(fmt::format("--shard {}: chunk {} of {} is out of range (0 <= I < N)", text, index, count),
                      true);
  }
  return ShardSpec{static_cast<int>(index), static_cast<int>(count)};
}

void check_shard_count(const ShardSpec& shard, size_t requests, const std::string& requests_file) {
  if (static_cast<size_t>(shard.count) > requests) {
    throw ConfigError(fmt::format("--shard {}/{}: {} chunks, but {} holds only {} request(s): use at most {} "
                                  "chunks (a larger count leaves chunks empty)",
                                  shard.index, shard.count, shard.count, requests_file, requests, requests),
                      true);
  }
}

}  // namespace tprun::jobs
