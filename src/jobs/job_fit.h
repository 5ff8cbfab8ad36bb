#pragma once
// A job's question to the fit planner (pipelines/fit_planner.h): what a
// manifest and its requests ask of each rank, for `tprun plan MANIFEST` and
// for `tprun run` with parallel.tp = "auto" or schedule.phases = "auto",
// so both answer the same.

#include <string>
#include <vector>

#include "jobs/manifest.h"
#include "jobs/request_list.h"
#include "pipelines/fit_planner.h"

namespace tprun::jobs {

// The manifest's model, dtype, layout and memory options, batch size,
// device_memory and phases ("together" / "staged" plan only that way), and
// the requests' sizes; a round keeps stage_requests embeddings (0: every
// request). `device`: "cpu" or "cuda". `world`: the job's ranks.
pipelines::FitQuery fit_query(const Manifest& manifest, const std::vector<JobRequest>& requests, int world,
                              const std::string& device);

// The plan as a table (one line per candidate, the refusals, the memory per
// rank and the choice), as `tprun plan` prints it and a job logs it.
std::string format_fit_plan(const pipelines::FitPlan& plan, const std::string& folder, int world);

// The error for a plan without a choice: nothing divides the world, or the
// smallest peak and what would help.
std::string no_fit_message(const pipelines::FitPlan& plan, const std::string& folder, int world);

}  // namespace tprun::jobs
