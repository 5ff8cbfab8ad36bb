// Flux2Pipeline / Flux2KleinPipeline: their specs, their load and their hooks
// into the generate skeleton. See flux2_pipeline.h for the semantics.
#include "pipelines/flux2_pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/decoder_text_encoder.h"
#include "models/flux2_transformer.h"
#include "models/model_config.h"
#include "models/vae.h"
#include "pipelines/component_configs.h"
#include "pipelines/flux2_conditioner.h"
#include "pipelines/flux2_latents.h"
#include "pipelines/latents.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

bool is_klein(const std::string& cls) { return cls == Flux2Pipeline::kKleinClass; }

// The transformer against the pipeline class; the text encoder (where read)
// against the transformer and the layers the pipeline stacks.
void flux2_cross_check(const ComponentConfigs& c) {
  const auto flux2 = c.parse<models::Flux2Config>("transformer");
  const std::string& transformer = c.at("transformer").path;
  if (!is_klein(c.cls()) && !flux2.guidance) {
    throw CheckpointError(fmt::format("{}: a Flux2Pipeline (dev) transformer needs guidance_embeds", transformer),
                          true);
  }
  if (!c.text_encoders()) return;
  const std::string& te = c.at("text_encoder").path;
  const auto ecfg = c.parse<models::DecoderConfig>("text_encoder");
  const std::vector<int64_t> layers = Flux2Conditioner::stacked_layers(is_klein(c.cls()));
  if (3 * ecfg.hidden_size != flux2.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not 3 x the text encoder's hidden_size {} ({})",
                                      transformer, flux2.joint_dim, ecfg.hidden_size, te),
                          true);
  }
  if (ecfg.layers < layers.back()) {
    throw CheckpointError(fmt::format("{}: the text encoder has {} layers; the {} stacks hidden states {}, {}, {}", te,
                                      ecfg.layers, c.cls(), layers[0], layers[1], layers[2]),
                          true);
  }
}

FamilyShapes flux2_shapes(const ComponentConfigs& c) {
  const auto f = c.parse<models::Flux2Config>("transformer");
  // SwiGLU's doubled input; the text encoder's width (three stacked hidden states); no pooled embedding.
  return {{f.heads, f.head_dim, 2 * f.mlp_hidden(), f.mlp_hidden(), f.in_channels, f.joint_dim}, f.joint_dim / 3, 0};
}

// What the FLUX.2 pipelines' requests may set: 512 text tokens; no
// true_cfg_scale (klein's CFG scale is guidance, dev's guidance is distilled);
// no negative prompt in dev.
RequestOptions flux2_request_options(const checkpoint::PipelineFolder& pf) {
  RequestOptions o;
  o.max_sequence_length = 512;
  const bool klein = is_klein(pf.cls);
  o.unused.emplace_back("true_cfg_scale", klein ? "klein's CFG scale is `guidance`, with a negative prompt"
                                                : "dev's guidance is distilled");
  if (!klein) o.unused.emplace_back("negative_prompt", "dev is guidance-distilled: it runs no negative pass");
  add_scheduler_request_options(pf, o);
  return o;
}

// The annotations of Flux2Pipeline / Flux2KleinPipeline.__init__: the text
// encoder split over the TP group unless shard_text_encoders = false (a 24B
// encoder replicated on every rank does not fit most GPUs), its stacked
// hidden layers; 50 steps, guidance 4.0.
PipelineSpec flux2_spec(const char* cls, const char* encoder, const std::vector<std::string>& tokenizers) {
  const bool klein = is_klein(cls);
  auto layers = [klein](const ComponentConfigs&) { return Flux2Conditioner::stacked_layers(klein); };
  return {cls,
          {transformer_component("Flux2Transformer2DModel"), vae_component({"AutoencoderKLFlux2"}),
           scheduler_component({"FlowMatchEulerDiscreteScheduler"}),
           text_encoder_component("text_encoder", {encoder}, TextSplit::kByDefault, layers),
           tokenizer_component("tokenizer", tokenizers)},
          CallDefaults{128, 50, 4.0, 1.0, 512}, true, flux2_cross_check, flux2_shapes, flux2_request_options,
          Flux2Conditioner::tokenize, load_family<Flux2Pipeline>};
}

PipelineSpec flux2_dev_spec() {
  return flux2_spec(Flux2Pipeline::kClass, "Mistral3ForConditionalGeneration", {"PixtralProcessor", "AutoProcessor"});
}
PipelineSpec flux2_klein_spec() {
  return flux2_spec(Flux2Pipeline::kKleinClass, "Qwen3ForCausalLM", {"Qwen2TokenizerFast", "Qwen2Tokenizer"});
}

}  // namespace

void Flux2Pipeline::configure(const ComponentConfigs& configs, const PipelineOptions&) {
  const checkpoint::PipelineFolder& pf = configs.folder();
  klein_ = is_klein(pf.cls);
  distilled_ = klein_ && models::config_bool_or(pf.index, "is_distilled", pf.path + "/model_index.json", false);
  text_ = std::make_unique<Flux2Conditioner>(configs, klein_, shapes_.transformer.joint_dim, ctx_.device, ctx_.dtype);
}

bool Flux2Pipeline::true_cfg(const GenerationRequest& r) const { return klein_ && !distilled_ && *r.guidance > 1.0; }

at::Tensor Flux2Pipeline::draw_latents(const GenerationRequest& q) const {
  return flux2_prepare_latents(q.seed, 1, shapes_.transformer.in_channels, *q.height, *q.width, ctx_.dtype,
                               ctx_.device, vae_scale_);
}

std::optional<double> Flux2Pipeline::schedule_mu(const Scheduler&, int64_t image_tokens,
                                                 int64_t steps) const {
  return compute_empirical_mu(image_tokens, steps);
}

// Image ids (0, row, col, 0), text ids (0, 0, 0, l); dev's distilled guidance embedding.
void Flux2Pipeline::add_transformer_inputs(models::TensorMap& in, const GenerationRequest& r, int64_t batch) const {
  const int64_t h = latent_side(*r.height, vae_scale_) / 2, w = latent_side(*r.width, vae_scale_) / 2;
  in["img_ids"] = flux2_image_ids(h, w, ctx_.device);
  in["txt_ids"] = flux2_text_ids(in.at("encoder_hidden_states").size(1), ctx_.device);
  if (!klein_) {
    in["guidance"] = at::full({batch}, *r.guidance, at::TensorOptions().dtype(at::kFloat).device(ctx_.device));
  }
}

// Unpacked to the h x w grid, de-normalised with the VAE's latent batch-norm
// statistics, unpatchified, decoded in the VAE's dtype.
at::Tensor Flux2Pipeline::decode_latents(const at::Tensor& packed, int64_t height, int64_t width) const {
  const int64_t h = latent_side(height, vae_scale_) / 2, w = latent_side(width, vae_scale_) / 2;
  const at::Tensor z = vae_->denormalize(flux2_unpack(packed, h, w));
  return vae_->decode(flux2_unpatchify(z).to(checkpoint::parse_compute_dtype(vae_->compute_dtype(), "vae dtype")));
}

TPRUN_REGISTER_PIPELINE_SPEC(flux2_dev_spec);
TPRUN_REGISTER_PIPELINE_SPEC(flux2_klein_spec);

}  // namespace tprun::pipelines
