// WanPipeline: its spec, its load and its hooks into the generate skeleton.
// See wan_pipeline.h for the semantics.
#include "pipelines/wan_pipeline.h"

#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/denoiser.h"
#include "models/model_config.h"
#include "models/t5_encoder.h"
#include "models/vae.h"
#include "models/vae_split_decode.h"
#include "models/wan_transformer.h"
#include "pipelines/component_configs.h"
#include "pipelines/component_loader.h"
#include "pipelines/latents.h"
#include "pipelines/wan_conditioner.h"
#include "checkpoint/hdf5_source.h"
#include "models/model_registry.h"
#include "runtime/error.h"
#include "runtime/memory_release.h"
#include "runtime/size_string.h"
#include "runtime/strict_json.h"
#include <spdlog/spdlog.h>

namespace tprun::pipelines {
namespace {

constexpr const char* kTransformerClass = "WanTransformer3DModel";
// diffusers' UMT5 limit: WanPipeline pads and truncates to max_sequence_length (512 by default).
constexpr int64_t kWanMaxSequenceLimit = 512;

// model_index.json's boundary_ratio: null / absent (one transformer) or a number in (0, 1).
std::optional<double> boundary_ratio(const checkpoint::PipelineFolder& pf) {
  const std::string file = pf.path + "/model_index.json";
  auto it = pf.index.find("boundary_ratio");
  if (it == pf.index.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0 || it->get<double>() >= 1) {
    throw CheckpointError(fmt::format("{}: boundary_ratio must be null or a number between 0 and 1 (found {})", file,
                                      clip_text(it->dump())),
                          true);
  }
  return it->get<double>();
}

// model_index.json's expand_timesteps: Wan 2.2 TI2V-5B's per-patch timesteps, not run by tprun.
void refuse_expand_timesteps(const checkpoint::PipelineFolder& pf) {
  auto it = pf.index.find("expand_timesteps");
  if (it == pf.index.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) return;
  throw CheckpointError(fmt::format("{}/model_index.json: expand_timesteps = {} (Wan 2.2 TI2V's per-patch timesteps) "
                                    "is not supported by tprun's WanPipeline; only false",
                                    pf.path, clip_text(it->dump())),
                        true);
}

// The scheduler config's num_train_timesteps (diffusers' default 1000).
int64_t num_train_timesteps(const checkpoint::PipelineFolder& pf) {
  const auto* s = pf.find("scheduler");
  if (!s) return 1000;
  const std::string path = s->path + "/scheduler_config.json";
  const nlohmann::json j = read_json_file(path, "scheduler config");
  auto it = j.find("num_train_timesteps");
  if (it == j.end() || it->is_null()) return 1000;
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 100000) {
    throw CheckpointError(fmt::format("{}: num_train_timesteps must be an integer from 1 to 100000", path), true);
  }
  return it->get<int64_t>();
}

// The experts against each other and the VAE; the text encoder (where read) against the transformer.
void wan_cross_check(const ComponentConfigs& c) {
  const checkpoint::PipelineFolder& pf = c.folder();
  refuse_expand_timesteps(pf);
  const auto t = c.parse<models::WanTransformerConfig>("transformer");
  const std::string& transformer = c.at("transformer").path;
  const models::VaeInfo& vae = c.vae();
  if (t.in_channels != vae.latent_channels || t.out_channels != vae.latent_channels) {
    throw CheckpointError(fmt::format("{}: a WanPipeline (text to video) needs in_channels = out_channels = the VAE's "
                                      "z_dim {} (got in_channels {}, out_channels {}; {})",
                                      transformer, vae.latent_channels, t.in_channels, t.out_channels,
                                      c.at("vae").path),
                          true);
  }
  const std::optional<double> boundary = boundary_ratio(pf);
  if (boundary && !c.has("transformer_2")) {
    throw CheckpointError(fmt::format("{}/model_index.json: boundary_ratio {} switches to transformer_2 for the "
                                      "low-noise steps, but the folder has no transformer_2",
                                      pf.path, *boundary),
                          true);
  }
  if (!boundary && c.has("transformer_2")) {
    throw CheckpointError(fmt::format("{}/model_index.json: transformer_2 is given without boundary_ratio, so "
                                      "WanPipeline would never run it; set boundary_ratio or remove transformer_2",
                                      pf.path),
                          true);
  }
  if (c.has("transformer_2")) {
    const auto t2 = c.parse<models::WanTransformerConfig>("transformer_2");
    // transformer_2 takes the latents and text transformer takes: the first key that differs is named.
    const std::pair<const char*, std::pair<std::string, std::string>> keys[] = {
        {"in_channels", {std::to_string(t2.in_channels), std::to_string(t.in_channels)}},
        {"out_channels", {std::to_string(t2.out_channels), std::to_string(t.out_channels)}},
        {"text_dim", {std::to_string(t2.text_dim), std::to_string(t.text_dim)}},
        {"patch_size", {fmt::format("[{}]", fmt::join(t2.patch_size, ", ")),
                        fmt::format("[{}]", fmt::join(t.patch_size, ", "))}}};
    for (const auto& [key, values] : keys) {
      if (values.first == values.second) continue;
      throw CheckpointError(fmt::format("{}: {} {} is not transformer's {} ({}): both experts of a WanPipeline take "
                                        "the same latents and text",
                                        c.at("transformer_2").path, key, values.first, values.second, transformer),
                            true);
    }
  }
  if (!c.text_encoders()) return;
  const int64_t d_model = c.parse<models::T5Config>("text_encoder").d_model;
  if (d_model != t.text_dim) {
    throw CheckpointError(fmt::format("{}: text_dim {} is not the text encoder's d_model {} ({})", transformer,
                                      t.text_dim, d_model, c.at("text_encoder").path),
                          true);
  }
}

FamilyShapes wan_shapes(const ComponentConfigs& c) {
  const auto t = c.parse<models::WanTransformerConfig>("transformer");
  // A GELU MLP of ffn_dim; the transformer's own text projection takes text_dim; no pooled embedding.
  return {{t.heads, t.head_dim, t.ffn_dim, t.ffn_dim, t.in_channels, t.text_dim}, t.text_dim,
          0};
}

// What WanPipeline's requests may set: 512 text tokens; guidance is its CFG
// scale (no true_cfg_scale); 4k + 1 frames (the VAE's temporal scale) up to
// what the transformer's RoPE tables reach; guidance_2 with two experts.
RequestOptions wan_request_options(const checkpoint::PipelineFolder& pf) {
  RequestOptions o;
  o.max_sequence_length = kWanMaxSequenceLimit;
  o.unused = {{"true_cfg_scale", "WanPipeline's CFG scale is guidance (CFG runs when it is above 1)"}};
  const auto& vae = need_component(pf, "vae");
  std::string vae_path;
  const models::VaeInfo info = models::read_vae_info(models::read_component_config(vae.path, &vae_path), vae_path);
  std::string t_path;
  const auto t = models::WanTransformerConfig::from_json(
      models::read_component_config(need_component(pf, "transformer").path, &t_path), t_path);
  o.frame_multiple = std::max<int64_t>(1, info.temporal_scale);
  o.frame_multiple_reason = fmt::format("the VAE compresses {} frames into one latent frame after the first ({})",
                                        o.frame_multiple, vae_path);
  // The RoPE table covers rope_max_seq_len positions on the time axis.
  o.max_frames = std::min<int64_t>(kMaxFrames, (t.rope_max_seq_len - 1) * o.frame_multiple + 1);
  if (o.max_frames < kMaxFrames) {
    o.max_frames_reason = fmt::format("{}: rope_max_seq_len {} covers {} latent frames", t_path, t.rope_max_seq_len,
                                      t.rope_max_seq_len);
  }
  o.default_fps = 16;
  o.accepts_guidance_2 = boundary_ratio(pf).has_value();  // the second expert's scale
  add_scheduler_request_options(pf, o);
  return o;
}

// The annotations of WanPipeline.__init__ (pipeline_wan.py): the UMT5
// encoder split over the TP group unless shard_text_encoders = false; the
// VAE on every rank (the decode is split); transformer_2 optional (Wan 2.2 A14B).
PipelineSpec wan_spec() {
  ComponentSpec transformer_2 = transformer_component(kTransformerClass);
  transformer_2.name = "transformer_2";
  transformer_2.required = false;
  transformer_2.staged_expert = true;
  ComponentSpec vae = vae_component({"AutoencoderKLWan"});
  vae.every_rank = true;
  CallDefaults defaults{60, 50, 5.0, 1.0, 512};
  defaults.height = 480;
  defaults.width = 832;
  defaults.frames = 81;
  return {WanPipeline::kClass,
          {transformer_component(kTransformerClass), transformer_2, vae,
           scheduler_component({"UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler"}),
           text_encoder_component("text_encoder", {"UMT5EncoderModel"}, TextSplit::kByDefault),
           tokenizer_component("tokenizer", {"T5TokenizerFast", "T5Tokenizer", "AutoTokenizer"})},
          defaults,
          false,
          wan_cross_check,
          wan_shapes,
          wan_request_options,
          WanConditioner::tokenize,
          load_family<WanPipeline>};
}

}  // namespace

void WanPipeline::configure(const ComponentConfigs& configs, const PipelineOptions& options) {
  const auto t = configs.parse<models::WanTransformerConfig>("transformer");
  in_channels_ = t.in_channels;
  temporal_scale_ = std::max<int64_t>(1, configs.vae().temporal_scale);
  if (const auto ratio = boundary_ratio(configs.folder())) {
    boundary_ = *ratio * static_cast<double>(num_train_timesteps(configs.folder()));
    staged_ = options.stage_experts && options.denoiser;
    variant_ = options.variant;
    const char* names[2] = {"transformer", "transformer_2"};
    for (int k = 0; k < 2; ++k) {
      expert_config_[k] = configs.at(names[k]);
      expert_options_[k] = component_load_options(*spec_->find(names[k]), configs, options);
    }
  }
  text_ = std::make_unique<WanConditioner>(configs.folder(), configs.text_encoders(), t.text_dim, ctx_.device,
                                           ctx_.dtype);
}

void WanPipeline::take_more(LoadedComponents& parts) { transformer_2_ = parts.take<models::Denoiser>("transformer_2"); }

void WanPipeline::hold_stage(int64_t stage) const {
  if (!staged_ || stage == held_stage_) return;
  // The held expert freed first: the two are never resident together.
  if (stage == 1) {
    transformer_.reset();
  } else {
    transformer_2_.reset();
  }
  release_free_memory();
  const ComponentConfig& cc = expert_config_[stage];
  auto source = checkpoint::open_weight_source(cc.folder, variant_);
  std::unique_ptr<models::Model> model = models::load_model(*source, cc.json, cc.path, ctx_.tp, expert_options_[stage]);
  auto* denoiser = dynamic_cast<models::Denoiser*>(model.get());
  if (!denoiser) throw Error(Error::Kind::Internal, fmt::format("{}: not a denoiser", cc.path));
  model.release();
  (stage == 1 ? transformer_2_ : transformer_).reset(denoiser);
  held_stage_ = stage;
  // The adapters reach `transformer` (diffusers' default: not transformer_2).
  rebind_loras("transformer", transformer_.get());
  if (ctx_.tp.rank == 0) {
    spdlog::info("experts staged: {} now holds {} ({})", ctx_.folder, stage == 1 ? "transformer_2" : "transformer",
                 format_size(denoiser->bytes_loaded()));
  }
}

bool WanPipeline::true_cfg(const GenerationRequest& r) const { return r.guidance.value_or(1.0) > 1.0; }

DenoiseStyle WanPipeline::denoise_style() const {
  DenoiseStyle style;
  style.timestep_thousandths = false;
  style.input_dtype = ctx_.dtype;
  return style;
}

bool WanPipeline::second_expert(float t) const { return boundary_ && static_cast<double>(t) < *boundary_; }

const models::Denoiser& WanPipeline::step_transformer(float t) const {
  if (second_expert(t)) {
    if (!transformer_2_) {
      throw Error(Error::Kind::Internal, fmt::format("{}: the step at t = {} needs transformer_2, which this load "
                                                     "does not hold",
                                                     ctx_.folder, t));
    }
    return *transformer_2_;
  }
  return *transformer_;
}

double WanPipeline::step_cfg_scale(const GenerationRequest& r, float t) const {
  if (second_expert(t)) return r.guidance_2.value_or(*r.guidance);
  return *r.guidance;
}

std::string WanPipeline::batch_key_extra(const GenerationRequest& r) const {
  if (!boundary_) return {};
  return fmt::format("g2:{}", r.guidance_2.value_or(*r.guidance));
}

std::string WanPipeline::latents_meaning() const {
  return fmt::format("latents [1, in_channels, (frames - 1) / {} + 1, height / {}, width / {}]", temporal_scale_,
                     vae_scale_, vae_scale_);
}

std::vector<int64_t> WanPipeline::latent_shape(int64_t height, int64_t width) const {
  return {in_channels_, 1, latent_side(height, vae_scale_), latent_side(width, vae_scale_)};
}

std::vector<int64_t> WanPipeline::request_latent_shape(const GenerationRequest& r) const {
  const int64_t frames = r.frame_count();
  return {in_channels_, (frames - 1) / temporal_scale_ + 1, latent_side(r.height.value_or(0), vae_scale_),
          latent_side(r.width.value_or(0), vae_scale_)};
}

int64_t WanPipeline::latent_tokens(const GenerationRequest& r) const {
  const std::vector<int64_t> s = request_latent_shape(r);
  return s[1] * (s[2] / 2) * (s[3] / 2);
}

at::Tensor WanPipeline::draw_latents(const GenerationRequest& r) const {
  std::vector<int64_t> shape = {1};
  for (int64_t d : request_latent_shape(r)) shape.push_back(d);
  return seeded_noise(r.seed, shape, at::kFloat, ctx_.device);
}

void WanPipeline::check_family_request(const GenerationRequest& r) const {
  if (r.guidance_2 && !std::isfinite(*r.guidance_2)) throw RequestError("guidance_2 must be a finite number", true);
}

at::Tensor WanPipeline::denormalized(const at::Tensor& latents) const {
  const c10::ScalarType vdt = checkpoint::parse_compute_dtype(vae_->compute_dtype(), "vae dtype");
  return vae_->denormalize(latents.to(vdt));
}

at::Tensor WanPipeline::decode_latents(const at::Tensor& latents, int64_t, int64_t) const {
  return vae_->decode(denormalized(latents));
}

BatchDecoder WanPipeline::batch_decoder(int64_t, int64_t, int64_t) const {
  return [this](const at::Tensor& latents) {
    return models::decode_across_group(*vae_, denormalized(latents), ctx_.tp, nullptr);
  };
}

TPRUN_REGISTER_PIPELINE_SPEC(wan_spec);

}  // namespace tprun::pipelines
