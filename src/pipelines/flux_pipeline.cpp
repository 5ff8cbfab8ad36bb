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
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/latents.h"
#include "pipelines/pipeline_components.h"
#include "pipelines/request_checks.h"
#include "pipelines/request_memory.h"
#include "text/t5_tokenizer.h"
#include "runtime/error.h"

namespace tprun::pipelines {

using Clock = std::chrono::steady_clock;

struct FluxPipeline::Impl {
  std::string folder;
  std::string dtype_name;
  c10::ScalarType dtype = at::kFloat;
  c10::Device device{c10::kCPU};
  parallel::TpContext tp;
  FlowMatchSchedulerConfig scheduler;
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
  uint64_t bytes = 0;
  std::shared_ptr<PromptCache> cache = std::make_shared<PromptCache>();
};

namespace {

const checkpoint::PipelineComponent& component(const checkpoint::PipelineFolder& f, const std::string& name) {
  const auto* c = f.find(name);
  if (!c) {
    throw CheckpointError(fmt::format("{}: model_index.json names no '{}' component (a FluxPipeline needs it)",
                                      f.path, name),
                          true);
  }
  return *c;
}

nlohmann::json component_config(const checkpoint::PipelineComponent& c, std::string* path) {
  return models::read_component_config(c.path, path);
}

// FluxPipeline.__call__'s defaults.
GenerationRequest flux_defaults(int64_t vae_scale_factor) {
  GenerationRequest d;
  d.height = d.width = 128 * vae_scale_factor;  // default_sample_size * vae_scale_factor
  d.steps = 28;
  d.guidance = 3.5;
  d.true_cfg_scale = 1.0;
  d.max_sequence_length = 512;
  return d;
}

// `r` with defaults applied.
bool do_true_cfg(const GenerationRequest& r) {
  const bool has_neg = r.negative_prompt.has_value() ||
                       (r.has_given("negative_prompt_embeds") && r.has_given("negative_pooled_prompt_embeds"));
  return *r.true_cfg_scale > 1.0 && has_neg;
}

}  // namespace

std::unique_ptr<FluxPipeline> FluxPipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                 const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->folder = folder;
  impl->dtype_name = options.dtype;
  impl->dtype = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  impl->device = c10::Device(options.device);
  impl->tp = tp;
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  check_pipeline_components(pf);

  // Configs first: every cross-component check before any weight byte is read.
  std::string tpath, vpath;
  const auto tconf = component_config(component(pf, "transformer"), &tpath);
  const auto vconf = component_config(component(pf, "vae"), &vpath);
  const auto fcfg = models::FluxConfig::from_json(tconf, tpath);
  const auto vcfg = models::VaeConfig::from_json(vconf, vpath);
  impl->vae_scale_factor = vcfg.scale_factor();
  check_vae_tiles(options.component_base.memory, vcfg.scale_factor(), vcfg.sample_size, vpath);
  impl->latent_channels = vcfg.latent_channels;
  impl->scaling_factor = vcfg.scaling_factor;
  impl->shift_factor = vcfg.shift_factor;
  if (fcfg.in_channels != 4 * vcfg.latent_channels) {
    throw CheckpointError(fmt::format("{}: in_channels {} is not 4 x the VAE's latent_channels {} ({})", tpath,
                                      fcfg.in_channels, vcfg.latent_channels, vpath),
                          true);
  }
  const auto& sched = component(pf, "scheduler");
  impl->scheduler = FlowMatchSchedulerConfig::from_file(sched.path + "/scheduler_config.json");

  nlohmann::json cconf, t5conf;
  std::string cpath, t5path;
  if (options.text_encoders) {
    cconf = component_config(component(pf, "text_encoder"), &cpath);
    t5conf = component_config(component(pf, "text_encoder_2"), &t5path);
    impl->clip_hidden = models::ClipTextConfig::from_json(cconf, cpath).hidden_size;
    impl->t5_dim = models::T5Config::from_json(t5conf, t5path).d_model;
    if (impl->clip_hidden != fcfg.pooled_dim) {
      throw CheckpointError(fmt::format("{}: pooled_projection_dim {} differs from the CLIP hidden_size {} ({})", tpath,
                                        fcfg.pooled_dim, impl->clip_hidden, cpath),
                            true);
    }
    if (impl->t5_dim != fcfg.joint_dim) {
      throw CheckpointError(fmt::format("{}: joint_attention_dim {} differs from the T5 d_model {} ({})", tpath,
                                        fcfg.joint_dim, impl->t5_dim, t5path),
                            true);
    }
    impl->tokenizer = std::make_unique<text::ClipTokenizer>(component(pf, "tokenizer").path);
    impl->tokenizer_2 = std::make_unique<text::T5Tokenizer>(component(pf, "tokenizer_2").path);
  }

  {
    auto source = checkpoint::open_weight_source(component(pf, "transformer").path, options.variant);
    models::ModelOptions o = component_options(options, "transformer");
    o.shard_modulation = options.shard_modulation;
    impl->transformer = models::FluxTransformer::load(*source, tconf, tpath, tp, o);
    impl->bytes += impl->transformer->bytes_loaded();
  }
  if (options.text_encoders) {
    {
      const models::ModelOptions o = component_options(options, "text_encoder");
      auto source = checkpoint::open_weight_source(component(pf, "text_encoder").path, options.variant);
      impl->clip = models::ClipTextModel::load(*source, cconf, cpath, {}, o);
      impl->bytes += impl->clip->bytes_loaded();
    }
    {
      auto source = checkpoint::open_weight_source(component(pf, "text_encoder_2").path, options.variant);
      const parallel::TpContext t5tp = options.shard_text_encoders.value_or(false) ? tp : parallel::TpContext{};
      const models::ModelOptions o = component_options(options, "text_encoder_2");
      impl->t5 = models::T5Encoder::load(*source, t5conf, t5path, t5tp, o);
      impl->bytes += impl->t5->bytes_loaded();
    }
  }
  if (options.decode_on_every_rank || tp.rank == 0) {
    auto source = checkpoint::open_weight_source(component(pf, "vae").path, options.variant);
    models::ModelOptions o = component_options(options, "vae");
    o.part = "decoder";
    impl->vae = models::AutoencoderKL::load(*source, vconf, vpath, {}, o);
    impl->bytes += impl->vae->bytes_loaded();
  }
  auto p = std::make_unique<FluxPipeline>();
  p->impl_ = std::move(impl);
  return p;
}

GenerationRequest FluxPipeline::with_defaults(GenerationRequest r) const {
  r.fill_from(flux_defaults(impl_->vae_scale_factor));
  return r;
}

std::string FluxPipeline::batch_key(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return fmt::format("{}x{}/{}/{}/{}/{}/{}", *g.height, *g.width, *g.steps, *g.guidance, *g.true_cfg_scale,
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
  check_image_size(*r.height, *r.width, m.vae_scale_factor);
  if (*r.steps < 1) throw RequestError(fmt::format("steps must be at least 1, got {}", *r.steps), true);
  if (*r.steps > 10000) throw RequestError(fmt::format("steps {} is beyond the limit of 10000", *r.steps), true);
  if (!std::isfinite(*r.guidance)) throw RequestError("guidance must be a finite number", true);
  if (!std::isfinite(*r.true_cfg_scale)) throw RequestError("true_cfg_scale must be a finite number", true);
  if (*r.max_sequence_length < 1 || *r.max_sequence_length > 512) {
    throw RequestError(
        fmt::format("max_sequence_length must be in [1, 512] (FluxPipeline's limit), got {}", *r.max_sequence_length),
        true);
  }
  const auto& c = m.transformer->config();
  const bool embeds = r.has_given("prompt_embeds");
  if (embeds != r.has_given("pooled_prompt_embeds")) {
    throw RequestError("prompt_embeds and pooled_prompt_embeds must be given together", true);
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
  const std::string key = fmt::format("{}\n{}", max_sequence_length, prompt);
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

std::vector<GenerationResult> FluxPipeline::generate_batch(const std::vector<GenerationRequest>& requests,
                                                           const StepCallback& on_step) const try {
  if (requests.empty()) return {};
  const std::vector<GenerationRequest> rs = prepare_batch(*this, requests);
  const GenerationRequest& r = rs.front();
  const Impl& m = *impl_;
  const auto& cfg = m.transformer->config();
  {  // Will it fit? Decided alike on every rank of the TP group (request_memory.h).
    MemoryModel mm;
    mm.pipeline = kClass;
    mm.transformer = {cfg.heads, cfg.head_dim, 4 * cfg.inner(), 4 * cfg.inner(), cfg.in_channels, cfg.joint_dim};
    mm.tp_size = m.tp.size;
    mm.attention_chunk = m.transformer->attention_chunk();
    mm.text_hidden = m.t5 ? m.t5_dim : 0;
    mm.weights_bytes = m.bytes;
    fill_runtime(mm, m.device.str(), m.dtype_name, m.vae.get());
    check_batch_memory(mm, batch_shape(*this, rs), m.tp, m.device.str());
  }
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(m.device);
  const int64_t batch = static_cast<int64_t>(rs.size());
  StageTimes times;

  // 1. Prompt embeddings, one prompt at a time (as alone), then stacked.
  auto t0 = Clock::now();
  const bool cfg_on = do_true_cfg(r);
  std::vector<at::Tensor> pe, pp, ne, np;
  // As FluxPipeline._get_t5_prompt_embeds / _get_clip_prompt_embeds warn.
  auto warn_encoded = [&](const GenerationRequest& q, const char* field, const models::TensorMap& e) {
    const bool leader = m.tp.rank == 0;
    warn_truncated(q, field, fmt::format("`max_sequence_length` is set to {} tokens", *q.max_sequence_length),
                   tokens_cut(e, "t5_tokens_cut"), leader);
    const int64_t clip_max = m.tokenizer->model_max_length();
    warn_truncated(q, field, fmt::format("CLIP can only handle sequences up to {} tokens", clip_max),
                   tokens_cut(e, "clip_tokens_cut"), leader);
  };
  for (const auto& q : rs) {
    auto given_or = [&](const std::string& name) { return q.given->at(name).to(m.device, m.dtype); };
    if (q.has_given("prompt_embeds")) {
      pe.push_back(given_or("prompt_embeds"));
      pp.push_back(given_or("pooled_prompt_embeds"));
    } else {
      auto e = encode_prompt(q.prompt, *q.max_sequence_length);
      warn_encoded(q, "prompt", e);
      pe.push_back(e.at("prompt_embeds"));
      pp.push_back(e.at("pooled_prompt_embeds"));
    }
    if (cfg_on) {
      if (q.has_given("negative_prompt_embeds")) {
        ne.push_back(given_or("negative_prompt_embeds"));
        np.push_back(given_or("negative_pooled_prompt_embeds"));
      } else {
        auto e = encode_prompt(q.negative_prompt.value_or(""), *q.max_sequence_length);
        warn_encoded(q, "negative_prompt", e);
        ne.push_back(e.at("prompt_embeds"));
        np.push_back(e.at("pooled_prompt_embeds"));
      }
    }
  }
  at::Tensor prompt_embeds = stack_batch(pe, "prompt_embeds"), pooled = stack_batch(pp, "pooled_prompt_embeds");
  at::Tensor neg_embeds, neg_pooled;
  if (cfg_on) {
    neg_embeds = stack_batch(ne, "negative_prompt_embeds");
    neg_pooled = stack_batch(np, "negative_pooled_prompt_embeds");
  }
  times.encode_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // 2. Latents (each from its own seed), ids, schedule, guidance.
  std::vector<at::Tensor> lv;
  for (const auto& q : rs) {
    lv.push_back(q.has_given("latents") ? q.given->at("latents").to(m.device, m.dtype)
                                        : prepare_latents(q.seed, 1, cfg.in_channels / 4, *q.height, *q.width,
                                                          m.dtype, m.device, m.vae_scale_factor));
  }
  at::Tensor latents = stack_batch(lv, "latents");
  const int64_t steps = *r.steps, height = *r.height, width = *r.width;
  const int64_t lh = latent_side(height, m.vae_scale_factor), lw = latent_side(width, m.vae_scale_factor);
  at::Tensor img_ids = latent_image_ids(lh / 2, lw / 2, m.dtype, m.device);
  at::Tensor txt_ids = at::zeros({prompt_embeds.size(1), 3}, at::TensorOptions().dtype(m.dtype).device(m.device));
  FlowMatchEulerDiscreteScheduler scheduler(m.scheduler);
  std::optional<double> mu;
  if (m.scheduler.use_dynamic_shifting) mu = scheduler.mu_for(latents.size(1));
  scheduler.set_timesteps(steps, mu);  // sigmas = linspace(1, 1/n, n), as FluxPipeline
  models::TensorMap in;
  in["encoder_hidden_states"] = prompt_embeds;
  in["pooled_projections"] = pooled;
  in["img_ids"] = img_ids;
  in["txt_ids"] = txt_ids;
  if (cfg.guidance) in["guidance"] = at::full({batch}, *r.guidance, fopts);
  models::TensorMap neg_in;
  if (cfg_on) {
    neg_in = in;
    neg_in["encoder_hidden_states"] = neg_embeds;
    neg_in["pooled_projections"] = neg_pooled;
    neg_in["txt_ids"] = at::zeros({neg_embeds.size(1), 3}, txt_ids.options());
  }

  // 3. Denoising.
  latents = denoise([&](const models::TensorMap& x) { return m.transformer->run(x); }, scheduler, latents, in,
                    cfg_on ? &neg_in : nullptr, *r.true_cfg_scale, on_step, times);

  // 4. Per image: the NaN check, then decode (on the rank that holds the VAE).
  LatentDecoder decode;
  if (m.vae) {
    decode = [&](const at::Tensor& lat) {
      at::Tensor z = unpack_latents(lat, height, width, m.vae_scale_factor);
      z = z / m.scaling_factor + m.shift_factor;
      // The VAE computes in fp32 when force_upcast lifts a 16-bit dtype.
      return m.vae->decode(z.to(checkpoint::parse_compute_dtype(m.vae->compute_dtype(), "vae dtype")));
    };
  }
  return finish_batch(latents, height, width, steps, m.dtype_name, decode, std::move(times));
} catch (...) {
  rethrow_generation_failure(impl_->tp);  // an allocation failure as a request error
}

int64_t FluxPipeline::vae_scale_factor() const { return impl_->vae_scale_factor; }
std::vector<int64_t> FluxPipeline::latent_shape(int64_t height, int64_t width) const {
  return {image_seq_len(height, width, impl_->vae_scale_factor), impl_->transformer->config().in_channels};
}
bool FluxPipeline::has_guidance_embeds() const { return impl_->transformer->config().guidance; }
bool FluxPipeline::decodes() const { return impl_->vae != nullptr; }
const std::string& FluxPipeline::folder() const { return impl_->folder; }
const std::string& FluxPipeline::dtype() const { return impl_->dtype_name; }
uint64_t FluxPipeline::bytes_loaded() const { return impl_->bytes; }
int64_t FluxPipeline::transformer_all_reduces() const { return impl_->transformer->all_reduces_per_forward(); }
PromptCacheStats FluxPipeline::prompt_cache_stats() const { return impl_->cache->stats(); }

TPRUN_REGISTER_PIPELINE(FluxPipeline);

namespace {

// CLIP padded to its model_max_length (77), T5 to max_sequence_length, as FluxPipeline.encode_prompt.
std::vector<PromptTokens> flux_tokenize(const std::string& folder, const std::string& prompt,
                                        int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const text::ClipTokenizer clip(component(pf, "tokenizer").path);
  const text::T5Tokenizer t5(component(pf, "tokenizer_2").path);
  return {{"tokenizer", "CLIP", clip.encode(prompt, clip.model_max_length())},
          {"tokenizer_2", "T5", t5.encode(prompt, max_sequence_length)}};
}

}  // namespace

TPRUN_REGISTER_PROMPT_TOKENIZER(FluxPipeline::kClass, flux_tokenize);

}  // namespace tprun::pipelines
