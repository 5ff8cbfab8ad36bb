#pragma once
// The [memory] settings (memory_options.h) applied to what loads models.

#include "memory/memory_options.h"
#include "models/model.h"
#include "pipelines/pipeline.h"

namespace tprun::memory {

// Sets the memory fields of a model load.
void apply(const MemoryOptions& memory, models::ModelOptions& options);
// Sets the memory fields every component of a pipeline loads with.
void apply(const MemoryOptions& memory, pipelines::PipelineOptions& options);

}  // namespace tprun::memory
