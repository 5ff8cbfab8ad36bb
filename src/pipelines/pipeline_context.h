#pragma once
// Where and how a loaded pipeline runs: its folder, compute dtype, device,
// TP group, the weight bytes this rank holds and its prompt cache.

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "parallel/tp_context.h"
#include "pipelines/pipeline.h"
#include "pipelines/prompt_cache.h"

namespace tprun::pipelines {

struct PipelineContext {
  std::string folder;
  std::string dtype_name;  // "fp32" | "bf16" | "fp16"
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device{c10::kCPU};
  parallel::TpContext tp;
  uint64_t bytes = 0;  // weight bytes loaded on this rank
  std::shared_ptr<PromptCache> cache = std::make_shared<PromptCache>();
  bool denoiser = true;  // the transformer and the VAE are loaded (PipelineOptions::denoiser)

  // Folder, dtype (ConfigError for an unknown one), device and TP group of a
  // load; ConfigError when the options load neither the text encoders nor
  // the denoiser (nothing would be loaded).
  void init(const std::string& folder, const parallel::TpContext& tp, const PipelineOptions& options);
  // Internal error naming `call` when the denoiser was not loaded: only the
  // encode phase of a staged job runs on such a pipeline.
  void need_denoiser(const char* call) const;
};

}  // namespace tprun::pipelines
