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

}  // namespace tprun::jobs
