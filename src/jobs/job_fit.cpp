// A job's question to the fit planner and the plan as text. See job_fit.h.
#include "jobs/job_fit.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/host_memory.h"

namespace tprun::jobs {

pipelines::FitQuery fit_query(const Manifest& m, const std::vector<JobRequest>& requests, int world,
                              const std::string& device) {
  pipelines::FitQuery q;
  q.folder = m.model;
  q.world = world;
  q.device = device;
  q.options.dtype = m.dtype;
  q.options.shard_text_encoders = m.shard_text_encoders;
  q.options.shard_modulation = m.shard_modulation;
  q.options.stage_experts = m.experts == "staged";
  q.options.component_base.memory = m.memory;
  q.lora_strict = m.lora_strict;  // the requests' adapters (their gen.loras) are counted by the planner
  q.batch = m.batch_size;
  if (m.device_memory > 0) q.rank_memory = m.device_memory;
  if (m.phases == "together" || m.phases == "staged") q.stages = m.phases;
  for (const auto& r : requests) {
    q.requests.push_back(r.gen);
    q.true_cfg = q.true_cfg || (r.gen.negative_prompt && !r.gen.negative_prompt->empty());
  }
  if (requests.empty()) q.requests.push_back(m.defaults);
  const auto pending = static_cast<int64_t>(requests.size());
  // All pending requests in one round, as many as a round may keep (the planner's bound).
  q.stage_requests = m.stage_requests > 0 ? m.stage_requests
                                          : std::min(std::max<int64_t>(pending, q.batch), pipelines::kMaxStageRequests);
  return q;
}

std::string format_fit_plan(const pipelines::FitPlan& plan, const std::string& folder, int world) {
  std::string out = fmt::format("plan for {} ({}), {} rank{} on {}: {}x{}{}, batch {}, {} text tokens{}{}\n", folder,
                                plan.pipeline, world, world == 1 ? "" : "s", plan.device, plan.height, plan.width,
                                plan.frames > 1 ? fmt::format(" x {} frames", plan.frames) : "", plan.batch,
                                plan.text_tokens, plan.true_cfg ? ", true CFG" : "",
                                plan.staged_experts ? ", experts staged (one held at a time)" : "");
  out += fmt::format("  {:>3} {:>3}  {:<9} {:>11} {:>11} {:>11} {:>11} {:>13}  {}\n", "tp", "dp", "stages", "encode",
                     "denoise", "decode", "peak", "with margin", "fits");
  for (const auto& c : plan.candidates) {
    out += fmt::format("  {:>3} {:>3}  {:<9} {:>11} {:>11} {:>11} {:>11} {:>13}  {}\n", c.tp, c.dp, c.stages,
                       format_bytes(c.phases.encode), format_bytes(c.phases.denoise), format_bytes(c.phases.decode),
                       format_bytes(c.peak), format_bytes(c.checked_peak), c.fits ? "yes" : "no");
  }
  for (const auto& r : plan.refused) out += fmt::format("  tp {}: not possible: {}\n", r.tp, r.reason);
  out += fmt::format("rank memory: {} ({}); peak includes {} per rank for the process; fits: the peak with the "
                     "margin of the check before each request (activations x 1.15 + 64 MiB)\n",
                     format_bytes(plan.rank_memory), plan.rank_memory_source, format_bytes(plan.overhead));
  if (plan.chosen) {
    out += fmt::format("chosen: tp {} x dp {}, {} (the least memory); schedule.phases = \"auto\" runs it {}{}\n",
                       plan.chosen->tp, plan.chosen->dp, plan.chosen->stages, plan.auto_stages,
                       plan.auto_stages == "together" ? " (together fits)" : "");
  }
  return out;
}

std::string no_fit_message(const pipelines::FitPlan& plan, const std::string& folder, int world) {
  if (plan.candidates.empty()) {
    return fmt::format("{}: no TP size divides the world of {} that the model allows", folder, world);
  }
  uint64_t least = 0;
  for (const auto& c : plan.candidates) least = least == 0 ? c.checked_peak : std::min(least, c.checked_peak);
  return fmt::format("{}: no plan fits in {} per rank (the smallest peak with the request check's margin is {}); "
                     "try more ranks, bf16, "
                     "[memory] layerwise_casting, offload or vae_tiling, or a smaller image",
                     folder, format_bytes(plan.rank_memory), format_bytes(least));
}

}  // namespace tprun::jobs
