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

struct Flux2Pipeline::Impl {
  std::string folder, cls;
  bool klein = false, distilled = false;
  std::string dtype_name;
  c10::ScalarType dtype = at::kFloat;
  c10::Device device{c10::kCPU};
  parallel::TpContext tp;
  FlowMatchSchedulerConfig scheduler;
  std::unique_ptr<models::Flux2Transformer> transformer;
  std::unique_ptr<models::DecoderTextEncoder> text_encoder;
  std::unique_ptr<text::HfTokenizer> tokenizer;
  std::unique_ptr<models::AutoencoderKL> vae;
  int64_t vae_scale_factor = 8;
  int64_t in_channels = 128;
  int64_t joint_dim = 0;
  uint64_t bytes = 0;
  std::shared_ptr<PromptCache> cache = std::make_shared<PromptCache>();
};

namespace {

const checkpoint::PipelineComponent& component(const checkpoint::PipelineFolder& f, const std::string& name) {
  const auto* c = f.find(name);
  if (!c) {
    throw CheckpointError(fmt::format("{}: model_index.json names no '{}' component (a {} needs it)", f.path, name,
                                      f.cls),
                          true);
  }
  return *c;
}

// The text encoder layers each pipeline stacks (text_encoder_out_layers).
std::vector<int64_t> stacked_layers(bool klein) {
  return klein ? std::vector<int64_t>{9, 18, 27} : std::vector<int64_t>{10, 20, 30};
}

// FLUX.2's __call__ defaults.
GenerationRequest flux2_defaults(int64_t vae_scale_factor) {
  GenerationRequest d;
  d.height = d.width = 128 * vae_scale_factor;  // default_sample_size * vae_scale_factor
  d.steps = 50;
  d.guidance = 4.0;
  d.true_cfg_scale = 1.0;
  d.max_sequence_length = 512;
  return d;
}

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

}  // namespace

std::unique_ptr<Flux2Pipeline> Flux2Pipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                   const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->folder = folder;
  impl->dtype_name = options.dtype;
  impl->dtype = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  impl->device = c10::Device(options.device);
  impl->tp = tp;
  const auto pf = checkpoint::open_pipeline_folder(folder);
  check_pipeline_components(pf);
  impl->cls = pf.cls;
  impl->klein = pf.cls == kKleinClass;
  impl->distilled = impl->klein && model_index_bool(pf, "is_distilled");

  // Configs first: every cross-component check before any weight byte is read.
  std::string tpath, vpath, epath;
  const auto tconf = models::read_component_config(component(pf, "transformer").path, &tpath);
  const auto vconf = models::read_component_config(component(pf, "vae").path, &vpath);
  const auto tcfg = models::Flux2Config::from_json(tconf, tpath);
  const auto vcfg = models::VaeConfig::from_json(vconf, vpath);
  if (!vcfg.flux2) {
    throw CheckpointError(fmt::format("{}: a {} needs an AutoencoderKLFlux2 VAE, not {}", vpath, pf.cls, vcfg.cls), true);
  }
  impl->vae_scale_factor = vcfg.scale_factor();
  check_vae_tiles(options.component_base.memory, vcfg.scale_factor(), vcfg.sample_size, vpath);
  impl->in_channels = tcfg.in_channels;
  impl->joint_dim = tcfg.joint_dim;
  if (tcfg.in_channels != 4 * vcfg.latent_channels) {
    throw CheckpointError(fmt::format("{}: in_channels {} is not 4 x the VAE's latent_channels {} ({})", tpath,
                                      tcfg.in_channels, vcfg.latent_channels, vpath),
                          true);
  }
  if (!impl->klein && !tcfg.guidance) {
    throw CheckpointError(fmt::format("{}: a Flux2Pipeline (dev) transformer needs guidance_embeds", tpath), true);
  }
  impl->scheduler = FlowMatchSchedulerConfig::from_file(component(pf, "scheduler").path + "/scheduler_config.json");

  const std::vector<int64_t> layers = stacked_layers(impl->klein);
  nlohmann::json econf;
  if (options.text_encoders) {
    econf = models::read_component_config(component(pf, "text_encoder").path, &epath);
    const auto ecfg = models::DecoderConfig::from_json(econf, epath);
    if (3 * ecfg.hidden_size != tcfg.joint_dim) {
      throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not 3 x the text encoder's hidden_size {} ({})",
                                        tpath, tcfg.joint_dim, ecfg.hidden_size, epath),
                            true);
    }
    if (ecfg.layers < layers.back()) {
      throw CheckpointError(fmt::format("{}: the text encoder has {} layers; the {} stacks hidden states {}, {}, {}",
                                        epath, ecfg.layers, pf.cls, layers[0], layers[1], layers[2]),
                            true);
    }
    // The tokenizer class model_index.json names (Qwen2TokenizerFast, PixtralProcessor) decides what
    // is read; the chat template must be one tprun knows (checked here, before any weight).
    const auto& tok = component(pf, "tokenizer");
    impl->tokenizer = std::make_unique<text::HfTokenizer>(text::HfTokenizer::load(tok.path, tok.cls));
    check_template_kind(*impl->tokenizer, impl->klein, pf.cls);
    if (impl->tokenizer->vocab_size() > ecfg.vocab_size) {
      throw CheckpointError(fmt::format("{}: the tokenizer has {} tokens but the text encoder's vocab_size is {} ({})",
                                        component(pf, "tokenizer").path, impl->tokenizer->vocab_size(),
                                        ecfg.vocab_size, epath),
                            true);
    }
  }

  // Every TP plan checked for this tp before any weight byte is read (the text
  // encoder's KV heads, the transformer's heads).
  const bool shard_text = options.shard_text_encoders.value_or(true);
  if (options.text_encoders && shard_text) {
    models::ModelOptions o;
    o.hidden_layers = layers;
    models::validate_tp_size(models::DecoderTextEncoder::table_for(models::DecoderConfig::from_json(econf, epath), o),
                             tp.size, epath);
  }
  {
    models::ModelOptions o;
    o.shard_modulation = options.shard_modulation;
    models::validate_tp_size(models::Flux2Transformer::table_for(tcfg, o), tp.size, tpath);
  }

  {
    auto source = checkpoint::open_weight_source(component(pf, "transformer").path, options.variant);
    models::ModelOptions o = component_options(options, "transformer");
    o.shard_modulation = options.shard_modulation;
    impl->transformer = models::Flux2Transformer::load(*source, tconf, tpath, tp, o);
    impl->bytes += impl->transformer->bytes_loaded();
  }
  if (options.text_encoders) {
    auto source = checkpoint::open_weight_source(component(pf, "text_encoder").path, options.variant);
    models::ModelOptions o = component_options(options, "text_encoder");
    o.hidden_layers = layers;
    const parallel::TpContext etp = shard_text ? tp : parallel::TpContext{};
    impl->text_encoder = models::DecoderTextEncoder::load(*source, econf, epath, etp, o);
    impl->bytes += impl->text_encoder->bytes_loaded();
  }
  if (options.decode_on_every_rank || tp.rank == 0) {
    auto source = checkpoint::open_weight_source(component(pf, "vae").path, options.variant);
    models::ModelOptions o = component_options(options, "vae");
    o.part = "decoder";
    impl->vae = models::AutoencoderKL::load(*source, vconf, vpath, {}, o);
    impl->bytes += impl->vae->bytes_loaded();
  }
  auto p = std::make_unique<Flux2Pipeline>();
  p->impl_ = std::move(impl);
  return p;
}

std::string Flux2Pipeline::class_name() const { return impl_->cls; }
bool Flux2Pipeline::klein() const { return impl_->klein; }
bool Flux2Pipeline::true_cfg(double guidance) const { return impl_->klein && !impl_->distilled && guidance > 1.0; }

GenerationRequest Flux2Pipeline::with_defaults(GenerationRequest r) const {
  r.fill_from(flux2_defaults(impl_->vae_scale_factor));
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
  check_image_size(*r.height, *r.width, m.vae_scale_factor);
  if (*r.steps < 1) throw RequestError(fmt::format("steps must be at least 1, got {}", *r.steps), true);
  if (*r.steps > 10000) throw RequestError(fmt::format("steps {} is beyond the limit of 10000", *r.steps), true);
  if (!std::isfinite(*r.guidance)) throw RequestError("guidance must be a finite number", true);
  if (*r.max_sequence_length < 1 || *r.max_sequence_length > 512) {
    throw RequestError(fmt::format("max_sequence_length must be in [1, 512] ({}'s limit), got {}", m.cls,
                                   *r.max_sequence_length),
                       true);
  }
  if (*r.true_cfg_scale != 1.0) {
    throw RequestError(fmt::format("true_cfg_scale is a FluxPipeline option; {} has none ({})", m.cls,
                                   m.klein ? "klein's CFG scale is `guidance`" : "dev uses distilled guidance"),
                       true);
  }
  if (!m.klein && r.negative_prompt) {
    throw RequestError("Flux2Pipeline (dev) has no negative prompt: it is guidance-distilled", true);
  }
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
  const std::string key = fmt::format("{}\n{}", max_sequence_length, prompt);
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

std::vector<GenerationResult> Flux2Pipeline::generate_batch(const std::vector<GenerationRequest>& requests,
                                                            const StepCallback& on_step) const try {
  if (requests.empty()) return {};
  const std::vector<GenerationRequest> rs = prepare_batch(*this, requests);
  const GenerationRequest& r = rs.front();
  const Impl& m = *impl_;
  {  // Will it fit? Decided alike on every rank of the TP group (request_memory.h).
    const auto& c = m.transformer->config();
    MemoryModel mm;
    mm.pipeline = m.cls;
    mm.transformer = {c.heads, c.head_dim, 2 * c.mlp_hidden(), c.mlp_hidden(), m.in_channels, m.joint_dim};
    mm.tp_size = m.tp.size;
    mm.attention_chunk = m.transformer->attention_chunk();
    mm.text_hidden = m.text_encoder ? m.joint_dim / 3 : 0;  // three stacked hidden states
    mm.weights_bytes = m.bytes;
    fill_runtime(mm, m.device.str(), m.dtype_name, m.vae.get());
    check_batch_memory(mm, batch_shape(*this, rs), m.tp, m.device.str());
  }
  const int64_t batch = static_cast<int64_t>(rs.size());
  const int64_t steps = *r.steps, height = *r.height, width = *r.width;
  const bool cfg = true_cfg(*r.guidance);
  StageTimes times;

  // 1. Prompt embeddings, one prompt at a time (as alone), then stacked.
  auto t0 = Clock::now();
  std::vector<at::Tensor> pe, ne;
  for (const auto& q : rs) {
    auto given_or_encoded = [&](const char* name, const char* field, const std::string& text) {
      if (q.has_given(name)) return q.given->at(name).to(m.device, m.dtype);
      const models::TensorMap e = encode_prompt(text, *q.max_sequence_length);
      warn_truncated(q, field, fmt::format("`max_sequence_length` is set to {} tokens", *q.max_sequence_length),
                     tokens_cut(e, "tokens_cut"), m.tp.rank == 0);
      return e.at("prompt_embeds");
    };
    pe.push_back(given_or_encoded("prompt_embeds", "prompt", q.prompt));
    // klein's negative prompt is "" unless the request gives one.
    if (cfg) ne.push_back(given_or_encoded("negative_prompt_embeds", "negative_prompt", q.negative_prompt.value_or("")));
  }
  const at::Tensor prompt_embeds = stack_batch(pe, "prompt_embeds");
  const at::Tensor neg_embeds = cfg ? stack_batch(ne, "negative_prompt_embeds") : at::Tensor();
  times.encode_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // 2. Latents (each from its own seed), ids, schedule.
  std::vector<at::Tensor> lv;
  for (const auto& q : rs) {
    lv.push_back(q.has_given("latents") ? q.given->at("latents").to(m.device, m.dtype)
                                        : flux2_prepare_latents(q.seed, 1, m.in_channels, height, width, m.dtype,
                                                                m.device, m.vae_scale_factor));
  }
  at::Tensor latents = stack_batch(lv, "latents");
  const int64_t h = latent_side(height, m.vae_scale_factor) / 2, w = latent_side(width, m.vae_scale_factor) / 2;
  FlowMatchEulerDiscreteScheduler scheduler(m.scheduler);
  scheduler.set_timesteps(steps, compute_empirical_mu(h * w, steps));
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(m.device);
  models::TensorMap in;
  in["encoder_hidden_states"] = prompt_embeds;
  in["img_ids"] = flux2_image_ids(h, w, m.device);
  in["txt_ids"] = flux2_text_ids(prompt_embeds.size(1), m.device);
  if (!m.klein) in["guidance"] = at::full({batch}, *r.guidance, fopts);
  models::TensorMap neg_in;
  if (cfg) {
    neg_in = in;
    neg_in["encoder_hidden_states"] = neg_embeds;
    neg_in["txt_ids"] = flux2_text_ids(neg_embeds.size(1), m.device);
  }

  // 3. Denoising.
  latents = denoise([&](const models::TensorMap& x) { return m.transformer->run(x); }, scheduler, latents, in,
                    cfg ? &neg_in : nullptr, *r.guidance, on_step, times);

  // 4. Per image: the NaN check, then decode (on the rank that holds the VAE).
  LatentDecoder decode;
  if (m.vae) {
    decode = [&](const at::Tensor& lat) {
      at::Tensor z = flux2_unpack(lat, h, w);
      z = z * m.vae->latent_bn_std().to(z.scalar_type()).view({1, -1, 1, 1}) +
          m.vae->latent_bn_mean().to(z.scalar_type()).view({1, -1, 1, 1});
      z = flux2_unpatchify(z).to(checkpoint::parse_compute_dtype(m.vae->compute_dtype(), "vae dtype"));
      return m.vae->decode(z);
    };
  }
  return finish_batch(latents, height, width, steps, m.dtype_name, decode, std::move(times));
} catch (...) {
  rethrow_generation_failure(impl_->tp);  // an allocation failure as a request error
}

std::vector<int64_t> Flux2Pipeline::latent_shape(int64_t height, int64_t width) const {
  return {image_seq_len(height, width, impl_->vae_scale_factor), impl_->in_channels};
}
bool Flux2Pipeline::decodes() const { return impl_->vae != nullptr; }
const std::string& Flux2Pipeline::folder() const { return impl_->folder; }
const std::string& Flux2Pipeline::dtype() const { return impl_->dtype_name; }
uint64_t Flux2Pipeline::bytes_loaded() const { return impl_->bytes; }
int64_t Flux2Pipeline::transformer_all_reduces() const { return impl_->transformer->all_reduces_per_forward(); }
PromptCacheStats Flux2Pipeline::prompt_cache_stats() const { return impl_->cache->stats(); }

TPRUN_REGISTER_PIPELINE(Flux2Pipeline);
TPRUN_REGISTER_PIPELINE_AS(Flux2Pipeline::kKleinClass, Flux2Pipeline);

namespace {

// The chat-templated prompt padded to max_sequence_length, as the pipelines' encode_prompt.
std::vector<PromptTokens> flux2_tokenize(const std::string& folder, const std::string& prompt,
                                         int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const bool klein = pf.cls == Flux2Pipeline::kKleinClass;
  const auto& tok = component(pf, "tokenizer");
  const text::HfTokenizer tokenizer = text::HfTokenizer::load(tok.path, tok.cls);
  check_template_kind(tokenizer, klein, pf.cls);
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  return {{"tokenizer", klein ? "Qwen3 chat template" : "Mistral chat template with the FLUX.2 system message",
           tokenizer.encode_chat(klein ? text::flux2_klein_chat(prompt) : text::flux2_dev_chat(prompt), max_sequence_length)}};
}

}  // namespace

TPRUN_REGISTER_PROMPT_TOKENIZER(Flux2Pipeline::kClass, flux2_tokenize);
TPRUN_REGISTER_PROMPT_TOKENIZER(Flux2Pipeline::kKleinClass, flux2_tokenize);

}  // namespace tprun::pipelines
