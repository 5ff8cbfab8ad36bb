#pragma once
// A pipeline's device map (memory.device_map / max_memory, diffusers'
// device_map="balanced" and explicit maps), resolved before any weight byte
// is read into component-qualified entries the components' loads apply
// (models::ModelBuilder::place_weights):
//   "balanced"  components sized from their tables (compute dtype), placed
//               largest first on the rank's accelerator, then the host, then
//               disk, each under its max_memory budget (none: no limit);
//   explicit    each entry names a component or a module inside one; an
//               entry naming neither is a ConfigError naming it.
// A rank has its own accelerator (one rank per accelerator), the host and
// disk; a map with tp > 1 is refused (TP splits the modules a map places).
// The result is logged in diffusers' hf_device_map form.

#include "checkpoint/pipeline_folder.h"
#include "parallel/tp_context.h"
#include "pipelines/pipeline.h"

namespace tprun::pipelines {

// `options` with memory.device_map resolved (strategy cleared); unchanged
// without a device map.
PipelineOptions resolve_device_map(const checkpoint::PipelineFolder& folder, const parallel::TpContext& tp,
                                   PipelineOptions options);

}  // namespace tprun::pipelines
