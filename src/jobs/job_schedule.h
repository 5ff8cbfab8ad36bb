#pragma once
// How a job's requests are grouped into units of work and spread over the dp
// replicas: pure functions of the requests, so every rank computes the same
// schedule with no messages and no coordinator.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "jobs/request_list.h"

namespace tprun::jobs {

// A unit of work: one request, or a batch of requests denoised together.
using Unit = std::vector<const JobRequest*>;

// Batches of up to `batch_size` requests with equal keys, formed in id order
// from `todo`, so a batch's members depend on the manifest and on what is left
// to run, never on dp, tp or the order of the file. A request whose key is
// nullopt (one the pipeline refuses) stays alone.
std::vector<Unit> make_units(const std::vector<const JobRequest*>& todo, int64_t batch_size,
                             const std::function<std::optional<std::string>(const JobRequest&)>& batch_key);

// Longest processing time first: units by decreasing cost (ties: the first
// id) onto the least-loaded replica (ties: the lowest index). Makespan within
// 4/3 of optimal for independent jobs.
std::vector<std::vector<Unit>> assign_units(std::vector<Unit> units, int replicas,
                                            const std::function<double(const JobRequest&)>& cost);

// One replica's units reordered so that units with the same LoRA adapter set
// (lora::lora_set_key of the first request's set: a batch never mixes sets)
// run one after another: the sets in order of their first unit, each set's
// units in their order (a stable sort). Which units a replica runs, and so
// its cost, stays as assign_units chose; only the order changes, so the
// pipeline switches sets at most once per distinct set.
void group_by_lora_set(std::vector<Unit>& units);

// --shard: chunk `index` of `count` of the requests.
struct ShardSpec {
  int index = 0;
  int count = 0;
};

// The most chunks --shard accepts (Slurm's own MaxArraySize tops out at 4,000,001).
constexpr long kMaxShardCount = 10000000;

// Parses "I/N" (decimal digits only: no sign, space or overflow; 0 <= I < N <= kMaxShardCount) or
// "slurm" ((SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP of SLURM_ARRAY_TASK_COUNT,
// checked alike; an id off the step or an unevenly spaced array is refused naming the variables).
// ConfigError naming --shard.
ShardSpec parse_shard_spec(const std::string& text);

// Refuses a count past the number of requests (some chunks would be empty): ConfigError naming
// --shard and the requests file.
void check_shard_count(const ShardSpec& shard, size_t requests, const std::string& requests_file);

}  // namespace tprun::jobs
