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
#include "pipelines/latents.h"
#include "pipelines/qwen_image_conditioner.h"
#include "pipelines/qwen_image_defaults.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

models::QwenImageConfig qwen_config(const ComponentConfigs& c) {
  const ComponentConfig& t = c.at("transformer");
  return models::QwenImageConfig::from_json(t.json, t.path);
}

// The transformer's 2x2 packing against the VAE; the text encoder (where read) against the transformer.
void qwen_image_cross_check(const ComponentConfigs& c) {
  const models::QwenImageConfig q = qwen_config(c);
  const std::string& transformer = c.at("transformer").path;
  check_packed_channels(q.in_channels, transformer, c.vae().latent_channels, c.at("vae").path);
  if (q.patch != 2 || q.out_channels * q.patch * q.patch != q.in_channels) {
    throw CheckpointError(fmt::format("{}: a QwenImagePipeline packs 2x2 latent patches: patch_size must be 2 and "
                                      "out_channels x 4 = in_channels (got patch_size {}, out_channels {}, "
                                      "in_channels {})",
                                      transformer, q.patch, q.out_channels, q.in_channels),
                          true);
  }
  if (!c.text_encoders()) return;
  const ComponentConfig& te = c.at("text_encoder");
  const auto ecfg = models::DecoderConfig::from_json(te.json, te.path);
  if (ecfg.hidden_size != q.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not the text encoder's hidden_size {} ({})",
                                      transformer, q.joint_dim, ecfg.hidden_size, te.path),
                          true);
  }
}

FamilyShapes qwen_image_shapes(const ComponentConfigs& c) {
  const models::QwenImageConfig q = qwen_config(c);
  FamilyShapes s;
  s.transformer = {q.heads, q.head_dim, q.mlp_hidden(), q.mlp_hidden(), q.in_channels, q.joint_dim};
  s.text_hidden = q.joint_dim;  // the text encoder's hidden size (checked equal)
  return s;
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

// The annotations of QwenImagePipeline.__init__ (pipeline_qwenimage.py): the
// Qwen2.5-VL language model split over the TP group unless
// shard_text_encoders = false; its last hidden state (every layer and the
// final norm; never the vision tower or lm_head).
PipelineSpec qwen_image_spec() {
  PipelineSpec s;
  s.cls = QwenImagePipeline::kClass;
  ComponentSpec te = text_encoder_component("text_encoder", {"Qwen2_5_VLForConditionalGeneration"});
  te.splittable = te.split_by_default = true;
  te.hidden_layers = [](const ComponentConfigs& c) {
    const ComponentConfig& e = c.at("text_encoder");
    return std::vector<int64_t>{models::DecoderConfig::from_json(e.json, e.path).layers};
  };
  s.components = {
      transformer_component("QwenImageTransformer2DModel"),
      vae_component({"AutoencoderKLQwenImage"}),
      scheduler_component({"FlowMatchEulerDiscreteScheduler"}),
      te,
      tokenizer_component("tokenizer", {"Qwen2Tokenizer", "Qwen2TokenizerFast"}),
  };
  // guidance stays unset: diffusers 0.40.0 builds no guidance embedder.
  s.defaults.steps = 50;
  s.defaults.true_cfg_scale = 4.0;
  s.cross_check = qwen_image_cross_check;
  s.shapes = qwen_image_shapes;
  s.request_options = qwen_image_request_options;
  s.tokenize = QwenImageConditioner::tokenize;
  s.load = [](const std::string& folder, const parallel::TpContext& tp, const PipelineOptions& options) {
    return std::unique_ptr<Pipeline>(QwenImagePipeline::load(folder, tp, options));
  };
  return s;
}

}  // namespace

std::unique_ptr<QwenImagePipeline> QwenImagePipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                           const PipelineOptions& options) {
  auto p = std::unique_ptr<QwenImagePipeline>(new QwenImagePipeline());
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const ComponentConfigs configs = p->begin_load(pf, tp, options);
  p->text_ = std::make_unique<QwenImageConditioner>(configs, p->shapes_.transformer.joint_dim, p->ctx_.device,
                                                    p->ctx_.dtype);
  p->finish_load(pf, configs, options);
  return p;
}

static_assert(std::string_view(QwenImagePipeline::kClass) == kQwenImagePipelineClass);

bool QwenImagePipeline::true_cfg(const GenerationRequest& r) const {
  const bool has_negative = r.negative_prompt.has_value() || r.has_given("negative_prompt_embeds");
  return r.true_cfg_scale.value_or(1.0) > 1.0 && has_negative;
}

// mu always passed, from the image tokens and the scheduler config's shifts.
std::optional<double> QwenImagePipeline::schedule_mu(const FlowMatchEulerDiscreteScheduler& scheduler,
                                                     int64_t image_tokens, int64_t) const {
  return scheduler.mu_for(image_tokens);
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
