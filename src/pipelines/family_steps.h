#pragma once
// The steps of loading and running a pipeline that the text-to-image
// families (FluxPipeline, Flux2Pipeline; QwenImagePipeline next) share
// around their own encoders, latents and conditioning:
//   need_component           a model_index.json component, or an error naming the pipeline
//   PipelineRuntime          where and how a pipeline runs (folder, dtype, device, TP group)
//   RuntimePipeline          the Pipeline accessors answered from a PipelineRuntime
//   check_packed_channels    transformer in_channels = 4 x the VAE's latent channels
//   load_vae_decoder         the VAE's decoder on the ranks that decode
//   check_steps_and_guidance / check_max_sequence_length   request checks
//   check_batch_fits         the memory estimate of a batch (request_memory.h)
//   batch_latents            each request's given or seeded latents, stacked
//   prompt_key / text_encode / embeddings_on_cpu   the staged phases' encodes
// What differs per family (its text encoders, its latents' layout, its
// transformer's inputs) stays in the family's own file.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "parallel/tp_context.h"
#include "pipelines/pipeline.h"
#include "pipelines/prompt_cache.h"
#include "pipelines/request_memory.h"

namespace tprun::checkpoint {
struct PipelineComponent;
struct PipelineFolder;
}  // namespace tprun::checkpoint

namespace tprun::models {
class AutoencoderKL;
}

namespace tprun::pipelines {

// The component `name` of `folder`; CheckpointError "model_index.json names
// no 'x' component (a <class> needs it)" when it has none.
const checkpoint::PipelineComponent& need_component(const checkpoint::PipelineFolder& folder,
                                                    const std::string& name);

// What every family's pipeline keeps about where and how it runs (the
// families' Impl structs extend it).
struct PipelineRuntime {
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

// The Pipeline accessors every family answers alike from its runtime
// (folder, dtype, weight bytes, the prompt cache); the family's pipeline
// derives from this and returns its Impl (a PipelineRuntime) from runtime().
class RuntimePipeline : public Pipeline {
 public:
  const std::string& folder() const override { return runtime().folder; }
  const std::string& dtype() const override { return runtime().dtype_name; }
  uint64_t bytes_loaded() const override { return runtime().bytes; }
  PromptCacheStats prompt_cache_stats() const override { return runtime().cache->stats(); }

 protected:
  virtual const PipelineRuntime& runtime() const = 0;
};

// CheckpointError (naming both files) unless the transformer's in_channels
// is 4 x the VAE's latent channels: 2x2 patches packed into the channels.
void check_packed_channels(int64_t in_channels, const std::string& transformer_config, int64_t latent_channels,
                           const std::string& vae_config);

// The VAE's decoder on the ranks that decode (TP rank 0, every rank with
// options.decode_on_every_rank), its bytes added to rt.bytes; null elsewhere.
std::unique_ptr<models::AutoencoderKL> load_vae_decoder(const checkpoint::PipelineComponent& vae,
                                                        const nlohmann::json& config, const std::string& config_path,
                                                        const PipelineOptions& options, PipelineRuntime& rt);

// RequestError unless steps is in [1, 10000] and guidance, where set, is
// finite (`r` with defaults applied; QwenImagePipeline has no default guidance).
void check_steps_and_guidance(const GenerationRequest& r);
// RequestError unless max_sequence_length is in [1, limit] (`cls`'s limit).
void check_max_sequence_length(const GenerationRequest& r, const std::string& cls, int64_t limit);

// Will the prepared batch fit? `model` carries the family's part (pipeline,
// transformer shape, attention_chunk, text_hidden); the runtime's part
// (TP size, weights, dtype, device, VAE) is filled here. Decided alike on
// every rank of the TP group (request_memory.h).
void check_batch_fits(const Pipeline& pipeline, const std::vector<GenerationRequest>& prepared, MemoryModel model,
                      const PipelineRuntime& rt, const VaeShape* vae);
// The same with an AutoencoderKL's shape (null: this rank does not decode).
void check_batch_fits(const Pipeline& pipeline, const std::vector<GenerationRequest>& prepared, MemoryModel model,
                      const PipelineRuntime& rt, const models::AutoencoderKL* vae);

// One request's initial noise from its seed (the family's layout).
using LatentDraw = std::function<at::Tensor(const GenerationRequest& request)>;
// Each request's given "latents" (in the runtime's dtype and device) or
// `draw`n from its seed, stacked into the batch (stack_batch).
at::Tensor batch_latents(const std::vector<GenerationRequest>& prepared, const PipelineRuntime& rt,
                         const LatentDraw& draw);

// The key of a prompt's embeddings, in the embeddings cache and in a
// TextEncode: max_sequence_length and the text, not the role, so a negative
// prompt "" and a prompt "" share one encode.
std::string prompt_key(const std::string& text, int64_t max_sequence_length);

// One encode a request needs: `field` ("prompt" | "negative_prompt") with its
// text, keyed by prompt_key, and the (encode_text name, given name) pairs.
TextEncode text_encode(const std::string& field, const std::string& text, int64_t max_sequence_length,
                       std::vector<std::pair<std::string, std::string>> gives);

// encode_text's result from encode_prompt's: every tensor on the CPU and
// contiguous, its dtype kept (the values are copied exactly).
models::TensorMap embeddings_on_cpu(const models::TensorMap& embeddings);

}  // namespace tprun::pipelines
