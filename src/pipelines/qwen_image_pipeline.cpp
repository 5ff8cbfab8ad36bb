// QwenImagePipeline: its spec, its load and its hooks into the generate
// skeleton. See qwen_image_pipeline.h for the semantics.
#include "pipelines/qwen_image_pipeline.h"

#include <string_view>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/decoder_text_encoder.h"
#include "models/model_config.h"
#include "models/qwen_image_transformer.h"
#include "models/vae.h"
#include "pipelines/component_configs.h"
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/latents.h"
#include "pipelines/qwen_image_conditioner.h"
#include "pipelines/qwen_image_defaults.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

// The transformer's 2x2 patches; the text encoder (where read) against the transformer.
void qwen_image_cross_check(const ComponentConfigs& c) {
  const auto q = c.parse<models::QwenImageConfig>("transformer");
  const std::string& transformer = c.at("transformer").path;
  if (q.patch != 2 || q.out_channels * q.patch * q.patch != q.in_channels) {
    throw CheckpointError(fmt::format("{}: a QwenImagePipeline packs 2x2 latent patches: patch_size must be 2 and "
                                      "out_channels x 4 = in_channels (got patch_size {}, out_channels {}, "
                                      "in_channels {})",
                                      transformer, q.patch, q.out_channels, q.in_channels),
                          true);
  }
  if (!c.text_encoders()) return;
  const int64_t hidden = c.parse<models::DecoderConfig>("text_encoder").hidden_size;
  if (hidden != q.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not the text encoder's hidden_size {} ({})",
                                      transformer, q.joint_dim, hidden, c.at("text_encoder").path),
                          true);
  }
}

FamilyShapes qwen_image_shapes(const ComponentConfigs& c) {
  const auto q = c.parse<models::QwenImageConfig>("transformer");
  // A GELU MLP; the text encoder's hidden size (checked equal to joint_dim); no pooled embedding.
  return {{q.heads, q.head_dim, q.mlp_hidden(), q.mlp_hidden(), q.in_channels, q.joint_dim}, q.joint_dim, 0};
}

// What QwenImagePipeline's requests may set: 1024 text tokens; no guidance
// (its CFG scale is true_cfg_scale); the steps its scheduler can stretch.
RequestOptions qwen_image_request_options(const checkpoint::PipelineFolder& pf) {
  RequestOptions o;
  o.max_sequence_length = kQwenImageMaxSequenceLimit;
  o.unused = {{"guidance", "diffusers' QwenImagePipeline has no guidance embedder; its CFG scale is true_cfg_scale, "
                           "with a negative prompt"}};
  add_scheduler_request_options(pf, o);
  return o;
}

// The last hidden state of the text encoder: every layer and the final norm.
std::vector<int64_t> last_hidden_layer(const ComponentConfigs& c) {
  return {c.parse<models::DecoderConfig>("text_encoder").layers};
}

// The annotations of QwenImagePipeline.__init__ (pipeline_qwenimage.py): the
// Qwen2.5-VL language model split over the TP group unless
// shard_text_encoders = false (never its vision tower or lm_head); 50 steps,
// true_cfg_scale 4.0, no guidance (diffusers 0.40.0 builds no guidance embedder).
PipelineSpec qwen_image_spec() {
  return {QwenImagePipeline::kClass,
          {transformer_component("QwenImageTransformer2DModel"), vae_component({"AutoencoderKLQwenImage"}),
           scheduler_component({"FlowMatchEulerDiscreteScheduler"}),
           text_encoder_component("text_encoder", {"Qwen2_5_VLForConditionalGeneration"}, TextSplit::kByDefault,
                                  last_hidden_layer),
           tokenizer_component("tokenizer", {"Qwen2Tokenizer", "Qwen2TokenizerFast"})},
          CallDefaults{128, 50, std::nullopt, 4.0, 512}, true, qwen_image_cross_check, qwen_image_shapes,
          qwen_image_request_options, QwenImageConditioner::tokenize, load_family<QwenImagePipeline>};
}

}  // namespace

void QwenImagePipeline::configure(const ComponentConfigs& configs, const PipelineOptions&) {
  text_ = std::make_unique<QwenImageConditioner>(configs, shapes_.transformer.joint_dim, ctx_.device, ctx_.dtype);
}

static_assert(std::string_view(QwenImagePipeline::kClass) == kQwenImagePipelineClass);

bool QwenImagePipeline::true_cfg(const GenerationRequest& r) const {
  const bool has_negative = r.negative_prompt.has_value() || r.has_given("negative_prompt_embeds");
  return r.true_cfg_scale.value_or(1.0) > 1.0 && has_negative;
}

// mu always passed, from the image tokens and the scheduler config's shifts.
std::optional<double> QwenImagePipeline::schedule_mu(const Scheduler& scheduler, int64_t image_tokens,
                                                     int64_t) const {
  return flow_match(scheduler).mu_for(image_tokens);
}

// img_shapes (1, h/2, w/2) per image; guidance is never passed.
void QwenImagePipeline::add_transformer_inputs(models::TensorMap& in, const GenerationRequest& r,
                                               int64_t batch) const {
  const int64_t h = latent_side(*r.height, vae_scale_) / 2, w = latent_side(*r.width, vae_scale_) / 2;
  in["img_shapes"] =
      at::tensor(std::vector<int64_t>{1, h, w}, at::TensorOptions().dtype(at::kLong)).view({1, 3}).repeat({batch, 1});
}

// Unpacked to [1, C, 1, h, w] in the VAE's dtype, the VAE's latent statistics undone, the frame decoded.
at::Tensor QwenImagePipeline::decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const {
  const c10::ScalarType vdt = checkpoint::parse_compute_dtype(vae_->compute_dtype(), "vae dtype");
  const at::Tensor z = unpack_latents(packed, height, width, vae_scale_).unsqueeze(2).to(vdt);
  return vae_->decode(vae_->denormalize(z)).select(2, 0);
}

TPRUN_REGISTER_PIPELINE_SPEC(qwen_image_spec);

}  // namespace tprun::pipelines
