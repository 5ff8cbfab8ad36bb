// FluxPipeline: loading the components of a pipeline folder and running one
// request (encode, denoise, decode). See flux_pipeline.h for the semantics.
#include "pipelines/flux_pipeline.h"

#include <chrono>
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/flux_transformer.h"
#include "models/model_config.h"
#include "models/t5_encoder.h"
#include "text/clip_tokenizer.h"
#include "pipelines/batch_stages.h"
#include "pipelines/family_steps.h"
#include "pipelines/flux_defaults.h"
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/latents.h"
#include "pipelines/pipeline_components.h"
#include "pipelines/request_checks.h"
#include "pipelines/request_memory.h"
#include "text/t5_tokenizer.h"
#include "runtime/error.h"

namespace tprun::pipelines {

using Clock = std::chrono::steady_clock;

struct FluxPipeline::Impl : PipelineRuntime {
  FlowMatchSchedulerConfig scheduler;
  models::FluxConfig flux;  // the transformer's config, read whether or not it is loaded
  std::unique_ptr<models::FluxTransformer> transformer;
  std::unique_ptr<models::ClipTextModel> clip;
  std::unique_ptr<models::T5Encoder> t5;
  std::unique_ptr<models::AutoencoderKL> vae;
  std::unique_ptr<text::ClipTokenizer> tokenizer;
  std::unique_ptr<text::T5Tokenizer> tokenizer_2;
  int64_t vae_scale_factor = kFluxVaeScaleFactor;
  int64_t latent_channels = 16;
  double scaling_factor = 1.0, shift_factor = 0.0;
  int64_t clip_hidden = 0, t5_dim = 0;
  RequestOptions request;  // what its requests may set (flux_request_options)
};

namespace {

// `r` with defaults applied.
bool do_true_cfg(const GenerationRequest& r) {
  const bool has_neg = r.negative_prompt.has_value() ||
                       (r.has_given("negative_prompt_embeds") && r.has_given("negative_pooled_prompt_embeds"));
  return *r.true_cfg_scale > 1.0 && has_neg;
}

// A component's config.json, its path in `path`.
nlohmann::json component_config(const checkpoint::PipelineFolder& pf, const std::string& name, std::string* path) {
  return models::read_component_config(need_component(pf, name).path, path);
}

// The configs every load reads before any weight byte.
struct FluxConfigs {
  nlohmann::json transformer, vae, clip, t5;
  std::string transformer_path, vae_path, clip_path, t5_path;
  models::FluxConfig flux;
};

// The transformer, VAE and scheduler configs, checked against each other.
FluxConfigs read_flux_configs(const checkpoint::PipelineFolder& pf, const PipelineOptions& options,
                              FluxPipeline::Impl& m) {
  FluxConfigs c;
  c.transformer = component_config(pf, "transformer", &c.transformer_path);
  c.vae = component_config(pf, "vae", &c.vae_path);
  c.flux = models::FluxConfig::from_json(c.transformer, c.transformer_path);
  m.flux = c.flux;
  const auto vcfg = models::VaeConfig::from_json(c.vae, c.vae_path);
  m.vae_scale_factor = vcfg.scale_factor();
  check_vae_tiles(options.component_base.memory, vcfg.scale_factor(), vcfg.sample_size, c.vae_path);
  m.latent_channels = vcfg.latent_channels;
  m.scaling_factor = vcfg.scaling_factor;
  m.shift_factor = vcfg.shift_factor;
  check_packed_channels(c.flux.in_channels, c.transformer_path, vcfg.latent_channels, c.vae_path);
  m.scheduler = FlowMatchSchedulerConfig::from_file(need_component(pf, "scheduler").path + "/scheduler_config.json");
  return c;
}

// CLIP's and T5's configs against the transformer's, and both tokenizers.
void read_text_encoder_configs(const checkpoint::PipelineFolder& pf, FluxConfigs& c, FluxPipeline::Impl& m) {
  c.clip = component_config(pf, "text_encoder", &c.clip_path);
  c.t5 = component_config(pf, "text_encoder_2", &c.t5_path);
  m.clip_hidden = models::ClipTextConfig::from_json(c.clip, c.clip_path).hidden_size;
  m.t5_dim = models::T5Config::from_json(c.t5, c.t5_path).d_model;
  if (m.clip_hidden != c.flux.pooled_dim) {
    throw CheckpointError(fmt::format("{}: pooled_projection_dim {} differs from the CLIP hidden_size {} ({})",
                                      c.transformer_path, c.flux.pooled_dim, m.clip_hidden, c.clip_path),
                          true);
  }
  if (m.t5_dim != c.flux.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} differs from the T5 d_model {} ({})",
                                      c.transformer_path, c.flux.joint_dim, m.t5_dim, c.t5_path),
                          true);
  }
  m.tokenizer = std::make_unique<text::ClipTokenizer>(need_component(pf, "tokenizer").path);
  m.tokenizer_2 = std::make_unique<text::T5Tokenizer>(need_component(pf, "tokenizer_2").path);
}

// The weights: the transformer over the TP group, CLIP replicated, T5
// replicated unless shard_text_encoders, the VAE's decoder where it decodes.
// Without the denoiser, the transformer's TP plan is still checked (from its
// config) so the encode phase of a staged job fails as the full load would.
void load_flux_components(const checkpoint::PipelineFolder& pf, const FluxConfigs& c, const PipelineOptions& options,
                          FluxPipeline::Impl& m) {
  models::ModelOptions transformer_options = component_options(options, "transformer");
  transformer_options.shard_modulation = options.shard_modulation;
  if (options.denoiser) {
    auto source = checkpoint::open_weight_source(need_component(pf, "transformer").path, options.variant);
    m.transformer = models::FluxTransformer::load(*source, c.transformer, c.transformer_path, m.tp, transformer_options);
    m.bytes += m.transformer->bytes_loaded();
  } else {
    models::validate_tp_size(models::FluxTransformer::table_for(c.flux, transformer_options), m.tp.size,
                             c.transformer_path);
  }
  if (options.text_encoders) {
    {
      const models::ModelOptions o = component_options(options, "text_encoder");
      auto source = checkpoint::open_weight_source(need_component(pf, "text_encoder").path, options.variant);
      m.clip = models::ClipTextModel::load(*source, c.clip, c.clip_path, {}, o);
      m.bytes += m.clip->bytes_loaded();
    }
    {
      auto source = checkpoint::open_weight_source(need_component(pf, "text_encoder_2").path, options.variant);
      const parallel::TpContext t5tp = options.shard_text_encoders.value_or(false) ? m.tp : parallel::TpContext{};
      const models::ModelOptions o = component_options(options, "text_encoder_2");
      m.t5 = models::T5Encoder::load(*source, c.t5, c.t5_path, t5tp, o);
      m.bytes += m.t5->bytes_loaded();
    }
  }
  if (options.denoiser) m.vae = load_vae_decoder(need_component(pf, "vae"), c.vae, c.vae_path, options, m);
}

}  // namespace

std::unique_ptr<FluxPipeline> FluxPipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                 const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->init(folder, tp, options);
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  check_pipeline_components(pf);
  // Configs first: every cross-component check before any weight byte is read.
  FluxConfigs configs = read_flux_configs(pf, options, *impl);
  impl->request = request_options(pf);
  if (options.text_encoders) read_text_encoder_configs(pf, configs, *impl);
  load_flux_components(pf, configs, options, *impl);
  auto p = std::make_unique<FluxPipeline>();
  p->impl_ = std::move(impl);
  return p;
}

GenerationRequest FluxPipeline::with_defaults(GenerationRequest r) const {
  r.fill_from(impl_->request.drop_unused(flux_defaults(impl_->vae_scale_factor)));
  return r;
}

std::string FluxPipeline::batch_key(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return fmt::format("{}x{}/{}/{}/{}/{}/{}", *g.height, *g.width, *g.steps, g.guidance.value_or(0.0), *g.true_cfg_scale,
                     *g.max_sequence_length, do_true_cfg(g));
}

double FluxPipeline::cost(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return static_cast<double>(*g.height) * static_cast<double>(*g.width) * static_cast<double>(*g.steps) *
         (do_true_cfg(g) ? 2.0 : 1.0);
}

void FluxPipeline::check_request(const GenerationRequest& request) const {
  const Impl& m = *impl_;
  const GenerationRequest r = with_defaults(request);
  need_request_options(r, m.request);
  check_image_size(*r.height, *r.width, m.vae_scale_factor);
  check_steps_and_guidance(r);
  if (!std::isfinite(*r.true_cfg_scale)) throw RequestError("true_cfg_scale must be a finite number", true);
  check_max_sequence_length(r, kClass, 512);
  const models::FluxConfig& c = m.flux;
  const bool embeds = r.has_given("prompt_embeds");
  if (embeds != r.has_given("pooled_prompt_embeds")) {
    throw RequestError("prompt_embeds and pooled_prompt_embeds must be given together", true);
  }
  if (r.has_given("negative_prompt_embeds") != r.has_given("negative_pooled_prompt_embeds")) {
    throw RequestError("negative_prompt_embeds and negative_pooled_prompt_embeds must be given together", true);
  }
  if (!embeds && !m.clip) {
    throw RequestError(fmt::format("{} was loaded without text encoders: give prompt_embeds and pooled_prompt_embeds",
                                   m.folder),
                       true);
  }
  need_text_prompts(r);
  need_given_shape(r, "prompt_embeds", {1, -1, c.joint_dim}, "[1, text tokens, joint_attention_dim]");
  need_given_shape(r, "pooled_prompt_embeds", {1, c.pooled_dim}, "[1, pooled_projection_dim]");
  need_given_shape(r, "negative_prompt_embeds", {1, -1, c.joint_dim}, "[1, text tokens, joint_attention_dim]");
  need_given_shape(r, "negative_pooled_prompt_embeds", {1, c.pooled_dim}, "[1, pooled_projection_dim]");
  need_given_shape(r, "latents", {1, image_seq_len(*r.height, *r.width, m.vae_scale_factor), c.in_channels},
             "packed latents [1, image tokens, in_channels] for this height and width");
  if (do_true_cfg(r) && !r.has_given("negative_prompt_embeds") && !m.clip) {
    throw RequestError("true CFG needs negative_prompt_embeds when no text encoders are loaded", true);
  }
  for (const auto& [name, t] : r.given ? *r.given : models::TensorMap{}) {
    static const char* known[] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                  "negative_pooled_prompt_embeds", "latents"};
    bool ok = false;
    for (const char* k : known) ok = ok || name == k;
    if (!ok) {
      throw RequestError(fmt::format("given tensor '{}' is not one of prompt_embeds, pooled_prompt_embeds, "
                                     "negative_prompt_embeds, negative_pooled_prompt_embeds, latents",
                                     name),
                         true);
    }
  }
}

models::TensorMap FluxPipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length) const {
  const Impl& m = *impl_;
  if (!m.clip || !m.t5) throw RequestError(fmt::format("{} was loaded without text encoders", m.folder), true);
  const std::string key = prompt_key(prompt, max_sequence_length);
  if (auto hit = m.cache->get(key)) return *hit;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const text::TokenizerOutput clip_tokens = m.tokenizer->encode(prompt, m.tokenizer->model_max_length());
  const text::TokenizerOutput t5_tokens = m.tokenizer_2->encode(prompt, max_sequence_length);
  const auto& clip_ids_vec = clip_tokens.input_ids;
  const auto& t5_ids_vec = t5_tokens.input_ids;
  at::Tensor clip_ids = at::tensor(clip_ids_vec, long_opts).view({1, -1}).to(m.device);
  at::Tensor t5_ids = at::tensor(t5_ids_vec, long_opts).view({1, -1}).to(m.device);
  auto clip_out = m.clip->encode(clip_ids);
  models::TensorMap out;
  out["pooled_prompt_embeds"] = clip_out.at("pooler_output").to(m.dtype);
  out["prompt_embeds"] = m.t5->encode(t5_ids).to(m.dtype);
  note_tokens_cut(out, "clip_tokens_cut", clip_tokens.untruncated_length, m.tokenizer->model_max_length());
  note_tokens_cut(out, "t5_tokens_cut", t5_tokens.untruncated_length, max_sequence_length);
  m.cache->put(key, out);
  return out;
}

std::vector<TextEncode> FluxPipeline::text_encodes(const GenerationRequest& request) const {
  const GenerationRequest r = with_defaults(request);
  std::vector<TextEncode> out;
  if (!r.has_given("prompt_embeds")) {
    out.push_back(text_encode("prompt", r.prompt, *r.max_sequence_length,
                              {{"prompt_embeds", "prompt_embeds"}, {"pooled_prompt_embeds", "pooled_prompt_embeds"}}));
  }
  if (do_true_cfg(r) && !r.has_given("negative_prompt_embeds")) {
    out.push_back(text_encode("negative_prompt", r.negative_prompt.value_or(""), *r.max_sequence_length,
                              {{"prompt_embeds", "negative_prompt_embeds"},
                               {"pooled_prompt_embeds", "negative_pooled_prompt_embeds"}}));
  }
  return out;
}

models::TensorMap FluxPipeline::encode_text(const TextEncode& encode) const {
  models::TensorMap out = embeddings_on_cpu(encode_prompt(encode.text, encode.max_sequence_length));
  // The CLIP limit its truncation warning names, for a pipeline without the tokenizer.
  if (out.count("clip_tokens_cut")) {
    out["clip_max_length"] = at::scalar_tensor(impl_->tokenizer->model_max_length(), at::kLong);
  }
  return out;
}

namespace {

// As FluxPipeline._get_t5_prompt_embeds / _get_clip_prompt_embeds warn, for
// the text `field` of `q` (defaults applied) from its embeddings: encode_prompt's
// (CLIP's limit from the tokenizer) or encode_text's (the limit carried along).
void warn_flux_truncation(const FluxPipeline::Impl& m, const GenerationRequest& q, const char* field,
                          int64_t max_sequence_length, const models::TensorMap& e) {
  const bool leader = m.tp.rank == 0;
  warn_truncated(q, field, fmt::format("`max_sequence_length` is set to {} tokens", max_sequence_length),
                 tokens_cut(e, "t5_tokens_cut"), leader);
  const int64_t clip_cut = tokens_cut(e, "clip_tokens_cut");
  if (clip_cut <= 0) return;
  const auto carried = e.find("clip_max_length");
  const int64_t clip_max = carried != e.end() ? carried->second.item<int64_t>()
                           : m.tokenizer      ? m.tokenizer->model_max_length()
                                              : 0;
  warn_truncated(q, field, fmt::format("CLIP can only handle sequences up to {} tokens", clip_max), clip_cut, leader);
}

}  // namespace

void FluxPipeline::warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                                   const models::TensorMap& embeddings) const {
  warn_flux_truncation(*impl_, with_defaults(request), encode.field.c_str(), encode.max_sequence_length, embeddings);
}

namespace {

// The batch's prompt embeddings, each prompt encoded alone (as generate()
// would) or taken as given, then stacked.
struct FluxPrompts {
  at::Tensor embeds, pooled;                    // [B, S, joint_dim], [B, pooled_dim]
  at::Tensor negative_embeds, negative_pooled;  // true CFG only
};

FluxPrompts encode_batch(const FluxPipeline& pipeline, const FluxPipeline::Impl& m,
                         const std::vector<GenerationRequest>& rs, bool true_cfg) {
  std::vector<at::Tensor> embeds, pooled, negative_embeds, negative_pooled;
  // The pair (embeds, pooled) of one prompt: given under `names`, else encoded from `text`.
  auto add = [&](const GenerationRequest& q, const char* embeds_name, const char* pooled_name, const char* field,
                 const std::string& text, std::vector<at::Tensor>& to_embeds, std::vector<at::Tensor>& to_pooled) {
    if (q.has_given(embeds_name)) {
      to_embeds.push_back(q.given->at(embeds_name).to(m.device, m.dtype));
      to_pooled.push_back(q.given->at(pooled_name).to(m.device, m.dtype));
      return;
    }
    const models::TensorMap e = pipeline.encode_prompt(text, *q.max_sequence_length);
    warn_flux_truncation(m, q, field, *q.max_sequence_length, e);
    to_embeds.push_back(e.at("prompt_embeds"));
    to_pooled.push_back(e.at("pooled_prompt_embeds"));
  };
  for (const auto& q : rs) {
    add(q, "prompt_embeds", "pooled_prompt_embeds", "prompt", q.prompt, embeds, pooled);
    if (true_cfg) {
      add(q, "negative_prompt_embeds", "negative_pooled_prompt_embeds", "negative_prompt",
          q.negative_prompt.value_or(""), negative_embeds, negative_pooled);
    }
  }
  FluxPrompts p;
  p.embeds = stack_batch(embeds, "prompt_embeds");
  p.pooled = stack_batch(pooled, "pooled_prompt_embeds");
  if (true_cfg) {
    p.negative_embeds = stack_batch(negative_embeds, "negative_prompt_embeds");
    p.negative_pooled = stack_batch(negative_pooled, "negative_pooled_prompt_embeds");
  }
  return p;
}

// The transformer's inputs besides latents and timestep; `negative` filled under true CFG.
struct FluxInputs {
  models::TensorMap positive, negative;
};

FluxInputs flux_inputs(const FluxPipeline::Impl& m, const FluxPrompts& prompts, const GenerationRequest& r,
                       int64_t batch, bool true_cfg) {
  const int64_t lh = latent_side(*r.height, m.vae_scale_factor), lw = latent_side(*r.width, m.vae_scale_factor);
  const at::Tensor txt_ids =
      at::zeros({prompts.embeds.size(1), 3}, at::TensorOptions().dtype(m.dtype).device(m.device));
  FluxInputs in;
  in.positive["encoder_hidden_states"] = prompts.embeds;
  in.positive["pooled_projections"] = prompts.pooled;
  in.positive["img_ids"] = latent_image_ids(lh / 2, lw / 2, m.dtype, m.device);
  in.positive["txt_ids"] = txt_ids;
  if (m.transformer->config().guidance) {
    in.positive["guidance"] = at::full({batch}, *r.guidance, at::TensorOptions().dtype(at::kFloat).device(m.device));
  }
  if (true_cfg) {
    in.negative = in.positive;
    in.negative["encoder_hidden_states"] = prompts.negative_embeds;
    in.negative["pooled_projections"] = prompts.negative_pooled;
    in.negative["txt_ids"] = at::zeros({prompts.negative_embeds.size(1), 3}, txt_ids.options());
  }
  return in;
}

// One image's packed latents to pixels: unpacked, z / scaling_factor + shift_factor, VAE decode.
LatentDecoder flux_decoder(const FluxPipeline::Impl& m, int64_t height, int64_t width) {
  if (!m.vae) return {};
  return [&m, height, width](const at::Tensor& lat) {
    at::Tensor z = unpack_latents(lat, height, width, m.vae_scale_factor);
    z = z / m.scaling_factor + m.shift_factor;
    // The VAE computes in fp32 when force_upcast lifts a 16-bit dtype.
    return m.vae->decode(z.to(checkpoint::parse_compute_dtype(m.vae->compute_dtype(), "vae dtype")));
  };
}

}  // namespace

std::vector<GenerationResult> FluxPipeline::generate_batch(const std::vector<GenerationRequest>& requests,
                                                           const StepCallback& on_step) const try {
  impl_->need_denoiser("generate_batch");
  if (requests.empty()) return {};
  const std::vector<GenerationRequest> rs = prepare_batch(*this, requests);
  const GenerationRequest& r = rs.front();
  const Impl& m = *impl_;
  const auto& cfg = m.transformer->config();
  MemoryModel fit;
  fit.pipeline = kClass;
  fit.transformer = {cfg.heads, cfg.head_dim, 4 * cfg.inner(), 4 * cfg.inner(), cfg.in_channels, cfg.joint_dim};
  fit.attention_chunk = m.transformer->attention_chunk();
  fit.text_hidden = m.t5 ? m.t5_dim : 0;
  check_batch_fits(*this, rs, fit, m, m.vae.get());
  const int64_t batch = static_cast<int64_t>(rs.size());
  const bool cfg_on = do_true_cfg(r);
  StageTimes times;

  // 1. Prompt embeddings.
  auto t0 = Clock::now();
  const FluxPrompts prompts = encode_batch(*this, m, rs, cfg_on);
  times.encode_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // 2. Latents (each from its own seed), ids, schedule, guidance.
  at::Tensor latents = batch_latents(rs, m, [&](const GenerationRequest& q) {
    return prepare_latents(q.seed, 1, cfg.in_channels / 4, *q.height, *q.width, m.dtype, m.device,
                           m.vae_scale_factor);
  });
  FluxInputs in = flux_inputs(m, prompts, r, batch, cfg_on);
  FlowMatchEulerDiscreteScheduler scheduler(m.scheduler);
  std::optional<double> mu;
  if (m.scheduler.use_dynamic_shifting) mu = scheduler.mu_for(latents.size(1));
  scheduler.set_timesteps(*r.steps, mu);  // sigmas = linspace(1, 1/n, n), as FluxPipeline

  // 3. Denoising.
  latents = denoise([&](const models::TensorMap& x) { return m.transformer->run(x); }, scheduler, latents,
                    in.positive, cfg_on ? &in.negative : nullptr, *r.true_cfg_scale, on_step, times);

  // 4. Per image: the NaN check, then decode (on the rank that holds the VAE).
  return finish_batch(latents, *r.height, *r.width, *r.steps, m.dtype_name, flux_decoder(m, *r.height, *r.width),
                      std::move(times));
} catch (...) {
  rethrow_generation_failure(impl_->tp);  // an allocation failure as a request error
}

int64_t FluxPipeline::vae_scale_factor() const { return impl_->vae_scale_factor; }
std::vector<int64_t> FluxPipeline::latent_shape(int64_t height, int64_t width) const {
  return {image_seq_len(height, width, impl_->vae_scale_factor), impl_->flux.in_channels};
}
bool FluxPipeline::has_guidance_embeds() const { return impl_->flux.guidance; }
bool FluxPipeline::decodes() const { return impl_->vae != nullptr; }
int64_t FluxPipeline::transformer_all_reduces() const {
  return impl_->transformer ? impl_->transformer->all_reduces_per_forward() : 0;
}
const PipelineRuntime& FluxPipeline::runtime() const { return *impl_; }

TPRUN_REGISTER_PIPELINE(FluxPipeline);

namespace {

// What FluxPipeline's requests may set: 512 T5 tokens; guidance only with a
// guidance embedder (FLUX.1-dev; diffusers passes none to schnell's).
RequestOptions flux_request_options(const checkpoint::PipelineFolder& pf) {
  RequestOptions o;
  o.max_sequence_length = 512;
  std::string path;
  const auto flux = models::FluxConfig::from_json(component_config(pf, "transformer", &path), path);
  if (!flux.guidance) {
    o.unused.emplace_back("guidance", fmt::format("{}: guidance_embeds is false (a FLUX.1-schnell-style transformer)",
                                                  path));
  }
  add_scheduler_request_options(pf, o);
  return o;
}

}  // namespace

TPRUN_REGISTER_REQUEST_OPTIONS(FluxPipeline::kClass, flux_request_options);

namespace {

// CLIP padded to its model_max_length (77), T5 to max_sequence_length, as FluxPipeline.encode_prompt.
std::vector<PromptTokens> flux_tokenize(const std::string& folder, const std::string& prompt,
                                        int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const text::ClipTokenizer clip(need_component(pf, "tokenizer").path);
  const text::T5Tokenizer t5(need_component(pf, "tokenizer_2").path);
  return {{"tokenizer", "CLIP", clip.encode(prompt, clip.model_max_length())},
          {"tokenizer_2", "T5", t5.encode(prompt, max_sequence_length)}};
}

}  // namespace

TPRUN_REGISTER_PROMPT_TOKENIZER(FluxPipeline::kClass, flux_tokenize);

}  // namespace tprun::pipelines
