// Flux2Pipeline / Flux2KleinPipeline: loading the components of a pipeline
// folder and running requests (encode, denoise, decode). See flux2_pipeline.h.
#include "pipelines/flux2_pipeline.h"

#include <chrono>
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/autoencoder_kl.h"
#include "models/decoder_text_encoder.h"
#include "models/flux2_transformer.h"
#include "models/model_config.h"
#include "pipelines/batch_stages.h"
#include "pipelines/flux2_defaults.h"
#include "pipelines/family_steps.h"
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/flux2_latents.h"
#include "text/chat_template.h"
#include "text/hf_tokenizer.h"
#include "pipelines/latents.h"
#include "pipelines/pipeline_components.h"
#include "pipelines/request_checks.h"
#include "pipelines/request_memory.h"
#include "runtime/error.h"

namespace tprun::pipelines {

using Clock = std::chrono::steady_clock;

struct Flux2Pipeline::Impl : PipelineRuntime {
  std::string cls;
  bool klein = false, distilled = false;
  FlowMatchSchedulerConfig scheduler;
  std::unique_ptr<models::Flux2Transformer> transformer;
  std::unique_ptr<models::DecoderTextEncoder> text_encoder;
  std::unique_ptr<text::HfTokenizer> tokenizer;
  std::unique_ptr<models::AutoencoderKL> vae;
  int64_t vae_scale_factor = 8;
  int64_t in_channels = 128;
  int64_t joint_dim = 0;
  RequestOptions request;  // what its requests may set (flux2_request_options)
};

namespace {

// The template the pipeline's caller reads must be the one its text encoder
// was trained with: a Qwen3 template in a dev folder (or Mistral's in klein)
// would fail or mis-render every request, so it is a folder error at load.
void check_template_kind(const text::HfTokenizer& tok, bool klein, const std::string& cls) {
  const text::ChatTemplateKind want = klein ? text::ChatTemplateKind::kQwen3 : text::ChatTemplateKind::kMistral3;
  const text::ChatTemplateKind got = tok.chat_template(klein ? text::ChatCaller::kTokenizer : text::ChatCaller::kProcessor);
  if (got != want) {
    throw CheckpointError(fmt::format("{}: the chat template is {}'s; a {} renders its prompts with the {} template "
                                      "(the tokenizer folder belongs to another pipeline)",
                                      tok.folder(), text::chat_template_name(got), cls, text::chat_template_name(want)),
                          true);
  }
}

bool model_index_bool(const checkpoint::PipelineFolder& pf, const std::string& field) {
  return models::config_bool_or(pf.index, field, pf.path + "/model_index.json", false);
}

// The configs every load reads before any weight byte.
struct Flux2Configs {
  nlohmann::json transformer, vae, text_encoder;
  std::string transformer_path, vae_path, text_encoder_path;
  models::Flux2Config flux2;
};

// The transformer, VAE and scheduler configs, checked against each other and the pipeline class.
Flux2Configs read_flux2_configs(const checkpoint::PipelineFolder& pf, const PipelineOptions& options,
                                Flux2Pipeline::Impl& m) {
  Flux2Configs c;
  c.transformer = models::read_component_config(need_component(pf, "transformer").path, &c.transformer_path);
  c.vae = models::read_component_config(need_component(pf, "vae").path, &c.vae_path);
  c.flux2 = models::Flux2Config::from_json(c.transformer, c.transformer_path);
  const auto vcfg = models::VaeConfig::from_json(c.vae, c.vae_path);
  if (!vcfg.flux2) {
    throw CheckpointError(fmt::format("{}: a {} needs an AutoencoderKLFlux2 VAE, not {}", c.vae_path, pf.cls,
                                      vcfg.cls),
                          true);
  }
  m.vae_scale_factor = vcfg.scale_factor();
  check_vae_tiles(options.component_base.memory, vcfg.scale_factor(), vcfg.sample_size, c.vae_path);
  m.in_channels = c.flux2.in_channels;
  m.joint_dim = c.flux2.joint_dim;
  check_packed_channels(c.flux2.in_channels, c.transformer_path, vcfg.latent_channels, c.vae_path);
  if (!m.klein && !c.flux2.guidance) {
    throw CheckpointError(
        fmt::format("{}: a Flux2Pipeline (dev) transformer needs guidance_embeds", c.transformer_path), true);
  }
  m.scheduler = FlowMatchSchedulerConfig::from_file(need_component(pf, "scheduler").path + "/scheduler_config.json");
  return c;
}

// The text encoder's config against the transformer's and the stacked
// layers, and its tokenizer with the chat template the pipeline renders.
void read_text_encoder_config(const checkpoint::PipelineFolder& pf, const std::vector<int64_t>& layers,
                              Flux2Configs& c, Flux2Pipeline::Impl& m) {
  c.text_encoder = models::read_component_config(need_component(pf, "text_encoder").path, &c.text_encoder_path);
  const auto ecfg = models::DecoderConfig::from_json(c.text_encoder, c.text_encoder_path);
  if (3 * ecfg.hidden_size != c.flux2.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not 3 x the text encoder's hidden_size {} ({})",
                                      c.transformer_path, c.flux2.joint_dim, ecfg.hidden_size, c.text_encoder_path),
                          true);
  }
  if (ecfg.layers < layers.back()) {
    throw CheckpointError(fmt::format("{}: the text encoder has {} layers; the {} stacks hidden states {}, {}, {}",
                                      c.text_encoder_path, ecfg.layers, pf.cls, layers[0], layers[1], layers[2]),
                          true);
  }
  // The tokenizer class model_index.json names (Qwen2TokenizerFast, PixtralProcessor) decides what
  // is read; the chat template must be one tprun knows (checked here, before any weight).
  const auto& tok = need_component(pf, "tokenizer");
  m.tokenizer = std::make_unique<text::HfTokenizer>(text::HfTokenizer::load(tok.path, tok.cls));
  check_template_kind(*m.tokenizer, m.klein, pf.cls);
  m.tokenizer->require_pad_token(pf.cls);
  m.tokenizer->check_ids_below(ecfg.vocab_size, c.text_encoder_path);
}

// Every TP plan checked for this tp before any weight byte is read (the text
// encoder's KV heads when it is sharded, the transformer's heads).
void validate_flux2_tp(const Flux2Configs& c, const std::vector<int64_t>& layers, bool shard_text,
                       const PipelineOptions& options, const parallel::TpContext& tp) {
  if (options.text_encoders && shard_text) {
    models::ModelOptions o;
    o.hidden_layers = layers;
    models::validate_tp_size(models::DecoderTextEncoder::table_for(
                                 models::DecoderConfig::from_json(c.text_encoder, c.text_encoder_path), o),
                             tp.size, c.text_encoder_path);
  }
  models::ModelOptions o;
  o.shard_modulation = options.shard_modulation;
  models::validate_tp_size(models::Flux2Transformer::table_for(c.flux2, o), tp.size, c.transformer_path);
}

// The weights: the transformer over the TP group, the text encoder over it
// too unless `shard_text` is off, the VAE's decoder where it decodes; the
// transformer and the VAE only with options.denoiser.
void load_flux2_components(const checkpoint::PipelineFolder& pf, const Flux2Configs& c,
                           const std::vector<int64_t>& layers, bool shard_text, const PipelineOptions& options,
                           Flux2Pipeline::Impl& m) {
  if (options.denoiser) {
    auto source = checkpoint::open_weight_source(need_component(pf, "transformer").path, options.variant);
    models::ModelOptions o = component_options(options, "transformer");
    o.shard_modulation = options.shard_modulation;
    m.transformer = models::Flux2Transformer::load(*source, c.transformer, c.transformer_path, m.tp, o);
    m.bytes += m.transformer->bytes_loaded();
  }
  if (options.text_encoders) {
    auto source = checkpoint::open_weight_source(need_component(pf, "text_encoder").path, options.variant);
    models::ModelOptions o = component_options(options, "text_encoder");
    o.hidden_layers = layers;
    const parallel::TpContext etp = shard_text ? m.tp : parallel::TpContext{};
    m.text_encoder = models::DecoderTextEncoder::load(*source, c.text_encoder, c.text_encoder_path, etp, o);
    m.bytes += m.text_encoder->bytes_loaded();
  }
  if (options.denoiser) m.vae = load_vae_decoder(need_component(pf, "vae"), c.vae, c.vae_path, options, m);
}

}  // namespace

std::unique_ptr<Flux2Pipeline> Flux2Pipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                   const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->init(folder, tp, options);
  const auto pf = checkpoint::open_pipeline_folder(folder);
  check_pipeline_components(pf);
  impl->cls = pf.cls;
  impl->klein = pf.cls == kKleinClass;
  impl->distilled = impl->klein && model_index_bool(pf, "is_distilled");

  // Configs first: every cross-component check before any weight byte is read.
  Flux2Configs configs = read_flux2_configs(pf, options, *impl);
  impl->request = request_options(pf);
  const std::vector<int64_t> layers = flux2_stacked_layers(impl->klein);
  if (options.text_encoders) read_text_encoder_config(pf, layers, configs, *impl);
  const bool shard_text = options.shard_text_encoders.value_or(true);
  validate_flux2_tp(configs, layers, shard_text, options, tp);
  load_flux2_components(pf, configs, layers, shard_text, options, *impl);
  auto p = std::make_unique<Flux2Pipeline>();
  p->impl_ = std::move(impl);
  return p;
}

std::string Flux2Pipeline::class_name() const { return impl_->cls; }
bool Flux2Pipeline::klein() const { return impl_->klein; }
bool Flux2Pipeline::true_cfg(double guidance) const { return impl_->klein && !impl_->distilled && guidance > 1.0; }

GenerationRequest Flux2Pipeline::with_defaults(GenerationRequest r) const {
  r.fill_from(impl_->request.drop_unused(flux2_defaults(impl_->vae_scale_factor)));
  return r;
}

std::string Flux2Pipeline::batch_key(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return fmt::format("{}x{}/{}/{}/{}/{}", *g.height, *g.width, *g.steps, *g.guidance, *g.max_sequence_length,
                     true_cfg(*g.guidance));
}

double Flux2Pipeline::cost(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return static_cast<double>(*g.height) * static_cast<double>(*g.width) * static_cast<double>(*g.steps) *
         (true_cfg(*g.guidance) ? 2.0 : 1.0);
}

void Flux2Pipeline::check_request(const GenerationRequest& request) const {
  const Impl& m = *impl_;
  const GenerationRequest r = with_defaults(request);
  need_request_options(r, m.request);
  check_image_size(*r.height, *r.width, m.vae_scale_factor);
  check_steps_and_guidance(r);
  check_max_sequence_length(r, m.cls, 512);
  const bool embeds = r.has_given("prompt_embeds");
  if (!embeds && !m.text_encoder) {
    throw RequestError(fmt::format("{} was loaded without its text encoder: give prompt_embeds", m.folder), true);
  }
  need_text_prompts(r);
  need_given_shape(r, "prompt_embeds", {1, -1, m.joint_dim}, "[1, text tokens, joint_attention_dim]");
  need_given_shape(r, "negative_prompt_embeds", {1, -1, m.joint_dim}, "[1, text tokens, joint_attention_dim]");
  need_given_shape(r, "latents", {1, image_seq_len(*r.height, *r.width, m.vae_scale_factor), m.in_channels},
             "packed latents [1, image tokens, in_channels] for this height and width");
  if (true_cfg(*r.guidance) && !r.has_given("negative_prompt_embeds") && !m.text_encoder) {
    throw RequestError("true CFG needs negative_prompt_embeds when no text encoder is loaded", true);
  }
  for (const auto& [name, t] : r.given ? *r.given : models::TensorMap{}) {
    if (name != "prompt_embeds" && name != "negative_prompt_embeds" && name != "latents") {
      throw RequestError(
          fmt::format("given tensor '{}' is not one of prompt_embeds, negative_prompt_embeds, latents", name), true);
    }
    if (name == "negative_prompt_embeds" && !m.klein) {
      throw RequestError("Flux2Pipeline (dev) takes no negative_prompt_embeds", true);
    }
  }
}

models::TensorMap Flux2Pipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length) const {
  const Impl& m = *impl_;
  if (!m.text_encoder) throw RequestError(fmt::format("{} was loaded without its text encoder", m.folder), true);
  const std::string key = prompt_key(prompt, max_sequence_length);
  if (auto hit = m.cache->get(key)) return *hit;
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  const text::TokenizerOutput tokens =
      m.tokenizer->encode_chat(m.klein ? text::flux2_klein_chat(prompt) : text::flux2_dev_chat(prompt), max_sequence_length);
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids = at::tensor(tokens.input_ids, long_opts).view({1, -1}).to(m.device);
  at::Tensor mask = at::tensor(tokens.attention_mask, long_opts).view({1, -1}).to(m.device);
  models::TensorMap out;
  out["prompt_embeds"] = m.text_encoder->stacked_hidden_states(ids, mask).to(m.dtype);
  note_tokens_cut(out, "tokens_cut", tokens.untruncated_length, max_sequence_length);
  m.cache->put(key, out);
  return out;
}

std::vector<TextEncode> Flux2Pipeline::text_encodes(const GenerationRequest& request) const {
  const GenerationRequest r = with_defaults(request);
  std::vector<TextEncode> out;
  if (!r.has_given("prompt_embeds")) {
    out.push_back(text_encode("prompt", r.prompt, *r.max_sequence_length, {{"prompt_embeds", "prompt_embeds"}}));
  }
  // klein's negative prompt is "" unless the request gives one; dev has none.
  if (true_cfg(*r.guidance) && !r.has_given("negative_prompt_embeds")) {
    out.push_back(text_encode("negative_prompt", r.negative_prompt.value_or(""), *r.max_sequence_length,
                              {{"prompt_embeds", "negative_prompt_embeds"}}));
  }
  return out;
}

models::TensorMap Flux2Pipeline::encode_text(const TextEncode& encode) const {
  return embeddings_on_cpu(encode_prompt(encode.text, encode.max_sequence_length));
}

namespace {

// The pipelines' truncation warning for the text `field` of `q` (defaults applied) from its embeddings.
void warn_flux2_truncation(const Flux2Pipeline::Impl& m, const GenerationRequest& q, const char* field,
                           int64_t max_sequence_length, const models::TensorMap& e) {
  warn_truncated(q, field, fmt::format("`max_sequence_length` is set to {} tokens", max_sequence_length),
                 tokens_cut(e, "tokens_cut"), m.tp.rank == 0);
}

}  // namespace

void Flux2Pipeline::warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                                    const models::TensorMap& embeddings) const {
  warn_flux2_truncation(*impl_, with_defaults(request), encode.field.c_str(), encode.max_sequence_length, embeddings);
}

namespace {

// The batch's prompt embeddings (and the negative ones under true CFG),
// each prompt encoded alone (as generate() would) or taken as given, then stacked.
struct Flux2Prompts {
  at::Tensor embeds, negative_embeds;
};

Flux2Prompts encode_batch(const Flux2Pipeline& pipeline, const Flux2Pipeline::Impl& m,
                          const std::vector<GenerationRequest>& rs, bool true_cfg) {
  std::vector<at::Tensor> embeds, negative_embeds;
  for (const auto& q : rs) {
    auto given_or_encoded = [&](const char* name, const char* field, const std::string& text) {
      if (q.has_given(name)) return q.given->at(name).to(m.device, m.dtype);
      const models::TensorMap e = pipeline.encode_prompt(text, *q.max_sequence_length);
      warn_flux2_truncation(m, q, field, *q.max_sequence_length, e);
      return e.at("prompt_embeds");
    };
    embeds.push_back(given_or_encoded("prompt_embeds", "prompt", q.prompt));
    // klein's negative prompt is "" unless the request gives one.
    if (true_cfg) {
      negative_embeds.push_back(
          given_or_encoded("negative_prompt_embeds", "negative_prompt", q.negative_prompt.value_or("")));
    }
  }
  Flux2Prompts p;
  p.embeds = stack_batch(embeds, "prompt_embeds");
  if (true_cfg) p.negative_embeds = stack_batch(negative_embeds, "negative_prompt_embeds");
  return p;
}

// The transformer's inputs besides latents and timestep for an h x w token
// grid; `negative` filled under true CFG.
struct Flux2Inputs {
  models::TensorMap positive, negative;
};

Flux2Inputs flux2_inputs(const Flux2Pipeline::Impl& m, const Flux2Prompts& prompts, const GenerationRequest& r,
                         int64_t batch, int64_t h, int64_t w, bool true_cfg) {
  Flux2Inputs in;
  in.positive["encoder_hidden_states"] = prompts.embeds;
  in.positive["img_ids"] = flux2_image_ids(h, w, m.device);
  in.positive["txt_ids"] = flux2_text_ids(prompts.embeds.size(1), m.device);
  if (!m.klein) {
    in.positive["guidance"] = at::full({batch}, *r.guidance, at::TensorOptions().dtype(at::kFloat).device(m.device));
  }
  if (true_cfg) {
    in.negative = in.positive;
    in.negative["encoder_hidden_states"] = prompts.negative_embeds;
    in.negative["txt_ids"] = flux2_text_ids(prompts.negative_embeds.size(1), m.device);
  }
  return in;
}

// One image's packed latents to pixels: unpacked to the h x w grid,
// de-normalised with the VAE's latent batch-norm statistics, unpatchified, VAE decode.
LatentDecoder flux2_decoder(const Flux2Pipeline::Impl& m, int64_t h, int64_t w) {
  if (!m.vae) return {};
  return [&m, h, w](const at::Tensor& lat) {
    at::Tensor z = flux2_unpack(lat, h, w);
    z = z * m.vae->latent_bn_std().to(z.scalar_type()).view({1, -1, 1, 1}) +
        m.vae->latent_bn_mean().to(z.scalar_type()).view({1, -1, 1, 1});
    z = flux2_unpatchify(z).to(checkpoint::parse_compute_dtype(m.vae->compute_dtype(), "vae dtype"));
    return m.vae->decode(z);
  };
}

}  // namespace

std::vector<GenerationResult> Flux2Pipeline::generate_batch(const std::vector<GenerationRequest>& requests,
                                                            const StepCallback& on_step) const try {
  impl_->need_denoiser("generate_batch");
  if (requests.empty()) return {};
  const std::vector<GenerationRequest> rs = prepare_batch(*this, requests);
  const GenerationRequest& r = rs.front();
  const Impl& m = *impl_;
  const auto& c = m.transformer->config();
  MemoryModel fit;
  fit.pipeline = m.cls;
  fit.transformer = {c.heads, c.head_dim, 2 * c.mlp_hidden(), c.mlp_hidden(), m.in_channels, m.joint_dim};
  fit.attention_chunk = m.transformer->attention_chunk();
  fit.text_hidden = m.text_encoder ? m.joint_dim / 3 : 0;  // three stacked hidden states
  check_batch_fits(*this, rs, fit, m, m.vae.get());
  const int64_t batch = static_cast<int64_t>(rs.size());
  const int64_t steps = *r.steps, height = *r.height, width = *r.width;
  const bool cfg = true_cfg(*r.guidance);
  StageTimes times;

  // 1. Prompt embeddings.
  auto t0 = Clock::now();
  const Flux2Prompts prompts = encode_batch(*this, m, rs, cfg);
  times.encode_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // 2. Latents (each from its own seed), ids, schedule.
  at::Tensor latents = batch_latents(rs, m, [&](const GenerationRequest& q) {
    return flux2_prepare_latents(q.seed, 1, m.in_channels, height, width, m.dtype, m.device, m.vae_scale_factor);
  });
  const int64_t h = latent_side(height, m.vae_scale_factor) / 2, w = latent_side(width, m.vae_scale_factor) / 2;
  FlowMatchEulerDiscreteScheduler scheduler(m.scheduler);
  scheduler.set_timesteps(steps, compute_empirical_mu(h * w, steps));
  Flux2Inputs in = flux2_inputs(m, prompts, r, batch, h, w, cfg);

  // 3. Denoising.
  latents = denoise([&](const models::TensorMap& x) { return m.transformer->run(x); }, scheduler, latents,
                    in.positive, cfg ? &in.negative : nullptr, *r.guidance, on_step, times);

  // 4. Per image: the NaN check, then decode (on the rank that holds the VAE).
  return finish_batch(latents, height, width, steps, m.dtype_name, flux2_decoder(m, h, w), std::move(times));
} catch (...) {
  rethrow_generation_failure(impl_->tp);  // an allocation failure as a request error
}

std::vector<int64_t> Flux2Pipeline::latent_shape(int64_t height, int64_t width) const {
  return {image_seq_len(height, width, impl_->vae_scale_factor), impl_->in_channels};
}
bool Flux2Pipeline::decodes() const { return impl_->vae != nullptr; }
int64_t Flux2Pipeline::transformer_all_reduces() const {
  return impl_->transformer ? impl_->transformer->all_reduces_per_forward() : 0;
}
const PipelineRuntime& Flux2Pipeline::runtime() const { return *impl_; }

TPRUN_REGISTER_PIPELINE(Flux2Pipeline);
TPRUN_REGISTER_PIPELINE_AS(Flux2Pipeline::kKleinClass, Flux2Pipeline);

namespace {

// What the FLUX.2 pipelines' requests may set: 512 text tokens; no
// true_cfg_scale (klein's CFG scale is guidance, dev's guidance is distilled);
// no negative prompt in dev.
RequestOptions flux2_request_options(const checkpoint::PipelineFolder& pf) {
  RequestOptions o;
  o.max_sequence_length = 512;
  const bool klein = pf.cls == Flux2Pipeline::kKleinClass;
  o.unused.emplace_back("true_cfg_scale", klein ? "klein's CFG scale is `guidance`, with a negative prompt"
                                                : "dev's guidance is distilled");
  if (!klein) o.unused.emplace_back("negative_prompt", "dev is guidance-distilled: it runs no negative pass");
  add_scheduler_request_options(pf, o);
  return o;
}

}  // namespace

TPRUN_REGISTER_REQUEST_OPTIONS(Flux2Pipeline::kClass, flux2_request_options);
TPRUN_REGISTER_REQUEST_OPTIONS(Flux2Pipeline::kKleinClass, flux2_request_options);

namespace {

// The chat-templated prompt padded to max_sequence_length, as the pipelines' encode_prompt.
std::vector<PromptTokens> flux2_tokenize(const std::string& folder, const std::string& prompt,
                                         int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const bool klein = pf.cls == Flux2Pipeline::kKleinClass;
  const auto& tok = need_component(pf, "tokenizer");
  const text::HfTokenizer tokenizer = text::HfTokenizer::load(tok.path, tok.cls);
  check_template_kind(tokenizer, klein, pf.cls);
  tokenizer.require_pad_token(pf.cls);
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  return {{"tokenizer", klein ? "Qwen3 chat template" : "Mistral chat template with the FLUX.2 system message",
           tokenizer.encode_chat(klein ? text::flux2_klein_chat(prompt) : text::flux2_dev_chat(prompt), max_sequence_length)}};
}

}  // namespace

TPRUN_REGISTER_PROMPT_TOKENIZER(Flux2Pipeline::kClass, flux2_tokenize);
TPRUN_REGISTER_PROMPT_TOKENIZER(Flux2Pipeline::kKleinClass, flux2_tokenize);

}  // namespace tprun::pipelines
