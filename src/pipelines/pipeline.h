#pragma once
// The interface every text-to-image pipeline offers `tprun generate` and the
// job runner, chosen by model_index.json's "_class_name". A pipeline family
// is its own files with one TPRUN_REGISTER_PIPELINE line in them; nothing
// above this layer names a family.
//
// Contract: every rank of a TP group loads the same pipeline and runs the
// same requests in the same order; requests are checked before any compute,
// identically on every rank, so a bad request fails everywhere at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lora/lora_adapters.h"
#include "models/model.h"
#include "parallel/tp_context.h"
#include "pipelines/generation_request.h"
#include "pipelines/prompt_cache.h"
#include "text/tokenizer_common.h"

namespace at {
class Tensor;
}

namespace tprun::pipelines {

struct PipelineOptions {
  std::string dtype = "fp32";  // compute dtype of every component: fp32 | bf16 | fp16
  std::string device = "cpu";
  std::string variant;                // weights variant ("fp16": *.fp16.safetensors)
  // The text encoders that have a TP plan run over the TP group too; unset:
  // the pipeline's choice (FluxPipeline: T5 replicated; FLUX.2 and
  // Qwen-Image: sharded).
  std::optional<bool> shard_text_encoders;
  bool shard_modulation = false;      // the transformer's AdaLN modulations rowwise_split_input
  bool text_encoders = true;          // false: requests must give prompt embeddings
  // false: the transformer and the VAE are not loaded (their configs are
  // still read and checked): the encode phase of a staged job, where only
  // with_defaults, check_request, batch_key, cost, latent_shape, text_encodes
  // and encode_text are called; generate_batch is an internal error.
  bool denoiser = true;
  bool decode_on_every_rank = false;  // default: TP rank 0 only loads the VAE and decodes
  // A pipeline with several experts (Wan 2.2 A14B) holds one at a time and
  // swaps them between a batch's stages ([schedule] experts = "staged");
  // false: every expert resident.
  bool stage_experts = false;
  // What every component's load starts from: its `memory` field holds the
  // [memory] / --memory settings; the pipeline adds dtype, device and each
  // component's own options on top.
  models::ModelOptions component_base;
};

// options.component_base with options' dtype and device.
models::ModelOptions component_options(const PipelineOptions& options);
// The same for one component ("transformer"): named, with its device-map
// entries (resolved by load_pipeline) made relative to it.
models::ModelOptions component_options(const PipelineOptions& options, const std::string& component);

struct StageTimes {
  double encode_s = 0;
  std::vector<double> step_s;
  double decode_s = 0;
  double denoise_s() const;
  double total_s() const { return encode_s + denoise_s() + decode_s; }
};

// One request's result: a frame sequence, of which an image is the one-frame
// case (every image family's results have frames = 1, and their tensors and
// bytes are laid out exactly as a single image's).
struct GenerationResult {
  std::shared_ptr<at::Tensor> latents;  // final (packed) latents, compute dtype
  // The decoded frames [F, H, W, 3] float32 in [0, 1] on the CPU ([1, H, W, 3]
  // for an image); null where not decoded.
  std::shared_ptr<at::Tensor> image;
  // F * H * W * 3 bytes, round(image * 255), frame after frame; empty where not decoded.
  std::vector<uint8_t> rgb;
  int64_t frames = 1;  // F: 1 for an image
  int64_t height = 0, width = 0;
  StageTimes times;        // this result's share of its batch's stage times
  int64_t batch_size = 1;  // results generated together with this one
  std::string error;       // generate_batch: why this result failed (NaN/Inf latents); "" = ok
  bool decoded() const { return !rgb.empty(); }
  // Frame f's H * W * 3 bytes (decoded results; f in [0, frames)).
  const uint8_t* frame_rgb(int64_t f) const { return rgb.data() + f * height * width * 3; }
};

// Staged phases (docs/jobs.md "Staged phases"): one text a request needs
// encoded, and the tensors its embeddings become in the request's `given`.
struct TextEncode {
  std::string field;  // "prompt" | "negative_prompt": the request field, for messages
  std::string text;
  int64_t max_sequence_length = 0;
  // Everything the embeddings depend on besides the model's weights and the
  // run's settings (text, max_sequence_length, ...): equal keys give equal
  // embeddings, so one encode serves every request with that key.
  std::string key;
  // (name in encode_text's map, name in GenerationRequest::given), e.g.
  // ("prompt_embeds", "negative_prompt_embeds") for a negative prompt.
  std::vector<std::pair<std::string, std::string>> gives;
};

// Called after each denoising step (step index, steps, seconds of that step).
using StepCallback = std::function<void(int64_t step, int64_t steps, double seconds)>;

class Pipeline {
 public:
  virtual ~Pipeline() = default;

  // "FluxPipeline", ...
  virtual std::string class_name() const = 0;
  // The request with every unset field set to this pipeline's default.
  virtual GenerationRequest with_defaults(GenerationRequest request) const = 0;
  // RequestError naming the field (size, steps, prompt, given tensors...).
  // Pure: no compute, no communication. Unset fields take the defaults.
  virtual void check_request(const GenerationRequest& request) const = 0;
  // Requests with equal keys may be denoised together (generate_batch).
  virtual std::string batch_key(const GenerationRequest& request) const = 0;
  // Relative cost of a request (for scheduling over replicas).
  virtual double cost(const GenerationRequest& request) const = 0;
  // Several requests of one batch key as one batch; each image is checked
  // and decoded alone (an image whose latents hold NaN/Inf gets `error`
  // set). RequestError for a bad request; internal error for mixed keys.
  virtual std::vector<GenerationResult> generate_batch(const std::vector<GenerationRequest>& requests,
                                                       const StepCallback& on_step = {}) const = 0;
  // generate_batch in parts, for a pipeline whose denoising weights are held
  // one stage at a time (weight_stages() > 1: Wan 2.2 A14B's experts,
  // staged): a job runs every batch of a round through stage 0, then every
  // one through stage 1, so the weights swap once a round, not once a batch.
  //   start_batch    checks, encodes, draws the latents and the schedule
  //   advance_batch  the denoising steps of stage s (its weights loaded
  //                  first where another stage's are held)
  //   finish_batch   the NaN/Inf checks and the decode: generate_batch's results
  // generate_batch is start, every stage in order, finish. A batch's errors
  // are generate_batch's, raised by the part that meets them.
  class InFlight {
   public:
    virtual ~InFlight() = default;
  };
  virtual int64_t weight_stages() const { return 1; }
  virtual std::unique_ptr<InFlight> start_batch(const std::vector<GenerationRequest>& requests,
                                                const StepCallback& on_step = {}) const;
  virtual void advance_batch(InFlight& batch, int64_t stage) const {}
  virtual std::vector<GenerationResult> finish_in_flight(InFlight& batch) const;
  // One request (a batch of one); a NaN/Inf result is a RequestError.
  GenerationResult generate(const GenerationRequest& request, const StepCallback& on_step = {}) const;
  // Shape [tokens, channels] of the latents generate() returns for a height x width image.
  virtual std::vector<int64_t> latent_shape(int64_t height, int64_t width) const = 0;
  // The shape of the latents generate() returns for a checked request with
  // its defaults (height, width and frames set). Here: latent_shape(height,
  // width), for an image; an internal error for frames other than 1, which
  // check_request refuses in an image pipeline. A family that makes frame
  // sequences overrides it (its latents span every latent frame).
  virtual std::vector<int64_t> request_latent_shape(const GenerationRequest& request) const;
  // The tokens the transformer attends over for such a request (every latent
  // frame's). Here: request_latent_shape's first size (packed latents).
  virtual int64_t latent_tokens(const GenerationRequest& request) const;

  // LoRA adapters (lora/lora_adapters.h): every distinct adapter set the
  // run will use ([] among them where some requests take none), mapped,
  // read as this rank's slices and checked before any compute; then the
  // apply mode ("auto" | "fused" | "runtime") is chosen. Once, before the
  // first batch; generate_batch puts each batch's set in force. Errors name
  // the file and key, alike on every rank. Here: a pipeline that takes no
  // adapters refuses any non-empty set.
  virtual void prepare_loras(const std::vector<std::vector<LoraChoice>>& sets, bool strict, const std::string& apply);
  // What prepare_loras read and keeps on this rank, and how it applies them.
  virtual lora::LoraStats lora_stats() const { return {}; }
  virtual bool decodes() const = 0;  // this rank loads the VAE and decodes
  virtual const std::string& folder() const = 0;
  virtual const std::string& dtype() const = 0;
  virtual uint64_t bytes_loaded() const = 0;
  // AllReduces per transformer forward on the TP group.
  virtual int64_t transformer_all_reduces() const = 0;
  // Prompt encodes run and saved by the embeddings cache on this rank.
  virtual PromptCacheStats prompt_cache_stats() const = 0;

  // Staged phases. The encodes a checked request needs that it does not
  // already give as tensors: its prompt, and its negative prompt where true
  // CFG runs; in the order generate_batch would encode them. Pure.
  virtual std::vector<TextEncode> text_encodes(const GenerationRequest& request) const = 0;
  // One encode's embeddings, on the CPU in the compute dtype, exactly as
  // generate_batch computes them (so given back through `gives` they make
  // the same image bytes), plus the pipeline's truncation counts (entries
  // not named in `gives`). Collective over the TP group where the text
  // encoders are sharded: every rank of the group calls it alike.
  virtual models::TensorMap encode_text(const TextEncode& encode) const = 0;
  // diffusers' truncation warnings for `request` from an encode_text result
  // (logged by TP rank 0 only), as generate_batch logs them.
  virtual void warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                               const models::TensorMap& embeddings) const = 0;
};

// The ids a pipeline folder's tokenizers give a prompt, exactly as the
// pipeline passes them to its text encoders (`tprun tokenize`); no weight is
// read. One entry per tokenizer component ("tokenizer", "tokenizer_2").
struct PromptTokens {
  std::string component;    // the tokenizer's component folder
  std::string description;  // "CLIP", "T5", "Qwen3 chat template", ...
  text::TokenizerOutput output;
};
using PromptTokenizer = std::function<std::vector<PromptTokens>(const std::string& folder, const std::string& prompt,
                                                                int64_t max_sequence_length)>;
// ConfigError naming the folder and the known classes for a class without one.
std::vector<PromptTokens> tokenize_prompt(const std::string& folder, const std::string& prompt,
                                          int64_t max_sequence_length);

using PipelineLoader = std::function<std::unique_ptr<Pipeline>(const std::string& folder, const parallel::TpContext& tp,
                                                               const PipelineOptions& options)>;

// Loads the pipeline `folder`'s model_index.json names. ConfigError naming
// the folder and the known classes for a folder that is not a pipeline tprun
// has, before any weight byte is read.
std::unique_ptr<Pipeline> load_pipeline(const std::string& folder, const parallel::TpContext& tp,
                                        const PipelineOptions& options = {});
std::vector<std::string> pipeline_names();

}  // namespace tprun::pipelines
