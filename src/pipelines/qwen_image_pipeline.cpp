// QwenImagePipeline: loading the components of a pipeline folder and running
// requests (encode, denoise, decode). See qwen_image_pipeline.h.
#include "pipelines/qwen_image_pipeline.h"

#include <chrono>
#include <cmath>
#include <string_view>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/decoder_text_encoder.h"
#include "models/model_config.h"
#include "models/qwen_image_transformer.h"
#include "models/qwen_image_vae.h"
#include "pipelines/batch_stages.h"
#include "pipelines/family_steps.h"
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/latents.h"
#include "pipelines/pipeline_components.h"
#include "pipelines/qwen_image_defaults.h"
#include "pipelines/qwen_image_layout.h"
#include "pipelines/qwen_image_text.h"
#include "pipelines/request_checks.h"
#include "pipelines/request_memory.h"
#include "runtime/error.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_batch.h"

namespace tprun::pipelines {

using Clock = std::chrono::steady_clock;

struct QwenImagePipeline::Impl : PipelineRuntime {
  FlowMatchSchedulerConfig scheduler;
  std::unique_ptr<models::QwenImageTransformer> transformer;
  std::unique_ptr<models::DecoderTextEncoder> text_encoder;
  std::unique_ptr<text::HfTokenizer> tokenizer;
  std::unique_ptr<models::QwenImageVae> vae;
  int64_t vae_scale_factor = 8;
  int64_t in_channels = 64;
  int64_t joint_dim = 0;
  std::vector<double> latents_mean, latents_std;
  RequestOptions request;  // what its requests may set (qwen_image_request_options)
};

namespace {

// The configs every load reads before any weight byte.
// The pipeline's tokenizer call for one prompt: the template, tokenizer([text],
// max_length=1024 + 34, padding=True, truncation=True) (one prompt is never padded).
text::TokenizerBatch qwen_image_tokens(const text::HfTokenizer& tokenizer, const std::string& prompt) {
  return text::encode_batch_longest(tokenizer, {qwen_image_prompt_text(prompt)},
                                    kQwenImageTokenizerMax + kQwenImageDropTokens);
}

struct QwenImageConfigs {
  nlohmann::json transformer, vae, text_encoder;
  std::string transformer_path, vae_path, text_encoder_path;
  models::QwenImageConfig qwen;
};

// The transformer, VAE and scheduler configs, checked against each other.
QwenImageConfigs read_qwen_image_configs(const checkpoint::PipelineFolder& pf, QwenImagePipeline::Impl& m) {
  QwenImageConfigs c;
  c.transformer = models::read_component_config(need_component(pf, "transformer").path, &c.transformer_path);
  c.vae = models::read_component_config(need_component(pf, "vae").path, &c.vae_path);
  c.qwen = models::QwenImageConfig::from_json(c.transformer, c.transformer_path);
  const auto vcfg = models::QwenImageVaeConfig::from_json(c.vae, c.vae_path);
  m.vae_scale_factor = vcfg.scale_factor();
  m.latents_mean = vcfg.latents_mean;
  m.latents_std = vcfg.latents_std;
  m.in_channels = c.qwen.in_channels;
  m.joint_dim = c.qwen.joint_dim;
  check_packed_channels(c.qwen.in_channels, c.transformer_path, vcfg.z_dim, c.vae_path);
  if (c.qwen.patch != 2 || c.qwen.out_channels * c.qwen.patch * c.qwen.patch != c.qwen.in_channels) {
    throw CheckpointError(fmt::format("{}: a QwenImagePipeline packs 2x2 latent patches: patch_size must be 2 and "
                                      "out_channels x 4 = in_channels (got patch_size {}, out_channels {}, "
                                      "in_channels {})",
                                      c.transformer_path, c.qwen.patch, c.qwen.out_channels, c.qwen.in_channels),
                          true);
  }
  m.scheduler = FlowMatchSchedulerConfig::from_file(need_component(pf, "scheduler").path + "/scheduler_config.json");
  return c;
}

// The text encoder's config against the transformer's, and its tokenizer.
void read_text_encoder_config(const checkpoint::PipelineFolder& pf, QwenImageConfigs& c, QwenImagePipeline::Impl& m) {
  c.text_encoder = models::read_component_config(need_component(pf, "text_encoder").path, &c.text_encoder_path);
  const auto ecfg = models::DecoderConfig::from_json(c.text_encoder, c.text_encoder_path);
  if (ecfg.hidden_size != c.qwen.joint_dim) {
    throw CheckpointError(fmt::format("{}: joint_attention_dim {} is not the text encoder's hidden_size {} ({})",
                                      c.transformer_path, c.qwen.joint_dim, ecfg.hidden_size, c.text_encoder_path),
                          true);
  }
  const auto& tok = need_component(pf, "tokenizer");
  m.tokenizer = std::make_unique<text::HfTokenizer>(text::HfTokenizer::load(tok.path, tok.cls));
  for (const char* special : {"<|im_start|>", "<|im_end|>"}) {
    if (!m.tokenizer->token_id(special)) {
      throw CheckpointError(fmt::format("{}: the tokenizer has no '{}' token; the QwenImagePipeline's prompt "
                                        "template needs it (the folder belongs to another pipeline)",
                                        tok.path, special),
                            true);
    }
  }
  m.tokenizer->require_pad_token(pf.cls);
  m.tokenizer->check_ids_below(ecfg.vocab_size, c.text_encoder_path);
}

// The hidden state the pipeline takes: the last one (after the final norm).
std::vector<int64_t> last_hidden_layer(const QwenImageConfigs& c) {
  return {models::DecoderConfig::from_json(c.text_encoder, c.text_encoder_path).layers};
}

// Every TP plan checked for this tp before any weight byte is read.
void validate_qwen_image_tp(const QwenImageConfigs& c, bool shard_text, const PipelineOptions& options,
                            const parallel::TpContext& tp) {
  if (options.text_encoders && shard_text) {
    models::ModelOptions o;
    o.hidden_layers = last_hidden_layer(c);
    models::validate_tp_size(models::DecoderTextEncoder::table_for(
                                 models::DecoderConfig::from_json(c.text_encoder, c.text_encoder_path), o),
                             tp.size, c.text_encoder_path);
  }
  models::ModelOptions o;
  o.shard_modulation = options.shard_modulation;
  models::validate_tp_size(models::QwenImageTransformer::table_for(c.qwen, o), tp.size, c.transformer_path);
}

// The VAE's decoder on the ranks that decode (TP rank 0, or every rank).
std::unique_ptr<models::QwenImageVae> load_qwen_image_vae(const checkpoint::PipelineFolder& pf,
                                                          const QwenImageConfigs& c, const PipelineOptions& options,
                                                          PipelineRuntime& rt) {
  if (!options.decode_on_every_rank && rt.tp.rank != 0) return nullptr;
  auto source = checkpoint::open_weight_source(need_component(pf, "vae").path, options.variant);
  models::ModelOptions o = component_options(options, "vae");
  o.part = "decoder";
  auto vae = models::QwenImageVae::load(*source, c.vae, c.vae_path, {}, o);
  rt.bytes += vae->bytes_loaded();
  return vae;
}

void load_qwen_image_components(const checkpoint::PipelineFolder& pf, const QwenImageConfigs& c, bool shard_text,
                                const PipelineOptions& options, QwenImagePipeline::Impl& m) {
  if (options.denoiser) {
    auto source = checkpoint::open_weight_source(need_component(pf, "transformer").path, options.variant);
    models::ModelOptions o = component_options(options, "transformer");
    o.shard_modulation = options.shard_modulation;
    m.transformer = models::QwenImageTransformer::load(*source, c.transformer, c.transformer_path, m.tp, o);
    m.bytes += m.transformer->bytes_loaded();
  }
  if (options.text_encoders) {
    auto source = checkpoint::open_weight_source(need_component(pf, "text_encoder").path, options.variant);
    models::ModelOptions o = component_options(options, "text_encoder");
    o.hidden_layers = last_hidden_layer(c);
    const parallel::TpContext etp = shard_text ? m.tp : parallel::TpContext{};
    m.text_encoder = models::DecoderTextEncoder::load(*source, c.text_encoder, c.text_encoder_path, etp, o);
    m.bytes += m.text_encoder->bytes_loaded();
  }
  if (options.denoiser) m.vae = load_qwen_image_vae(pf, c, options, m);
}

}  // namespace

std::unique_ptr<QwenImagePipeline> QwenImagePipeline::load(const std::string& folder, const parallel::TpContext& tp,
                                                           const PipelineOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->init(folder, tp, options);
  const auto pf = checkpoint::open_pipeline_folder(folder);
  check_pipeline_components(pf);
  // Configs first: every cross-component check before any weight byte is read.
  QwenImageConfigs configs = read_qwen_image_configs(pf, *impl);
  impl->request = request_options(pf);
  if (options.text_encoders) read_text_encoder_config(pf, configs, *impl);
  const bool shard_text = options.shard_text_encoders.value_or(true);
  validate_qwen_image_tp(configs, shard_text, options, tp);
  load_qwen_image_components(pf, configs, shard_text, options, *impl);
  auto p = std::make_unique<QwenImagePipeline>();
  p->impl_ = std::move(impl);
  return p;
}

std::string QwenImagePipeline::class_name() const { return kClass; }
static_assert(std::string_view(QwenImagePipeline::kClass) == kQwenImagePipelineClass);

bool QwenImagePipeline::true_cfg(const GenerationRequest& r) {
  const bool has_negative = r.negative_prompt.has_value() || r.has_given("negative_prompt_embeds");
  return r.true_cfg_scale.value_or(1.0) > 1.0 && has_negative;
}

GenerationRequest QwenImagePipeline::with_defaults(GenerationRequest r) const {
  r.fill_from(impl_->request.drop_unused(qwen_image_defaults(impl_->vae_scale_factor)));
  return r;
}

std::string QwenImagePipeline::batch_key(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  const bool cfg = true_cfg(g);
  // Only what changes the batch's compute (guidance never does: see the header).
  return fmt::format("{}x{}/{}/{}/{}", *g.height, *g.width, *g.steps,
                     cfg ? fmt::format("cfg{}", *g.true_cfg_scale) : "nocfg", *g.max_sequence_length);
}

double QwenImagePipeline::cost(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return static_cast<double>(*g.height) * static_cast<double>(*g.width) * static_cast<double>(*g.steps) *
         (true_cfg(g) ? 2.0 : 1.0);
}

void QwenImagePipeline::check_request(const GenerationRequest& request) const {
  const Impl& m = *impl_;
  const GenerationRequest r = with_defaults(request);
  need_request_options(r, m.request);
  check_image_size(*r.height, *r.width, m.vae_scale_factor);
  check_steps_and_guidance(r);
  check_max_sequence_length(r, kClass, kQwenImageMaxSequenceLimit);
  if (!std::isfinite(*r.true_cfg_scale)) throw RequestError("true_cfg_scale must be a finite number", true);
  const bool embeds = r.has_given("prompt_embeds");
  if (!embeds && !m.text_encoder) {
    throw RequestError(fmt::format("{} was loaded without its text encoder: give prompt_embeds", m.folder), true);
  }
  need_text_prompts(r);
  const std::string text_shape = "[1, text tokens, joint_attention_dim]";
  need_given_shape(r, "prompt_embeds", {1, -1, m.joint_dim}, text_shape);
  need_given_shape(r, "negative_prompt_embeds", {1, -1, m.joint_dim}, text_shape);
  need_given_shape(r, "latents", {1, image_seq_len(*r.height, *r.width, m.vae_scale_factor), m.in_channels},
                   "packed latents [1, image tokens, in_channels] for this height and width");
  for (const auto& [mask, of] : {std::pair<const char*, const char*>{"prompt_embeds_mask", "prompt_embeds"},
                                 {"negative_prompt_embeds_mask", "negative_prompt_embeds"}}) {
    if (!r.has_given(mask)) continue;
    if (!r.has_given(of)) throw RequestError(fmt::format("{} is given without {}", mask, of), true);
    need_given_shape(r, mask, {1, r.given->at(of).size(1)}, fmt::format("[1, the text tokens of {}]", of));
  }
  if (true_cfg(r) && !r.has_given("negative_prompt_embeds") && !m.text_encoder) {
    throw RequestError("true CFG needs negative_prompt_embeds when no text encoder is loaded", true);
  }
  for (const auto& [name, t] : r.given ? *r.given : models::TensorMap{}) {
    if (name != "prompt_embeds" && name != "prompt_embeds_mask" && name != "negative_prompt_embeds" &&
        name != "negative_prompt_embeds_mask" && name != "latents") {
      throw RequestError(fmt::format("given tensor '{}' is not one of prompt_embeds, prompt_embeds_mask, "
                                     "negative_prompt_embeds, negative_prompt_embeds_mask, latents",
                                     name),
                         true);
    }
  }
}

models::TensorMap QwenImagePipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length) const {
  const Impl& m = *impl_;
  if (!m.text_encoder) throw RequestError(fmt::format("{} was loaded without its text encoder", m.folder), true);
  const std::string key = prompt_key(prompt, max_sequence_length);
  if (auto hit = m.cache->get(key)) return *hit;
  text::decode_utf8(prompt, "prompt");  // offsets of bad bytes in the user's prompt, not in the templated text
  const text::TokenizerBatch tokens = qwen_image_tokens(*m.tokenizer, prompt);
  const int64_t untruncated = tokens.untruncated_lengths.front();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor id_tensor = at::tensor(tokens.input_ids.front(), long_opts).view({1, -1}).to(m.device);
  const at::Tensor mask = at::ones_like(id_tensor);
  const at::Tensor hidden = m.text_encoder->hidden_states(id_tensor, mask).front();
  models::TensorMap out;
  out["prompt_embeds"] = qwen_image_keep_tokens(hidden, kQwenImageDropTokens, max_sequence_length).to(m.dtype);
  note_tokens_cut(out, "tokens_cut", untruncated - kQwenImageDropTokens, max_sequence_length);
  m.cache->put(key, out);
  return out;
}

std::vector<TextEncode> QwenImagePipeline::text_encodes(const GenerationRequest& request) const {
  const GenerationRequest r = with_defaults(request);
  std::vector<TextEncode> out;
  if (!r.has_given("prompt_embeds")) {
    out.push_back(text_encode("prompt", r.prompt, *r.max_sequence_length, {{"prompt_embeds", "prompt_embeds"}}));
  }
  if (true_cfg(r) && !r.has_given("negative_prompt_embeds")) {
    out.push_back(text_encode("negative_prompt", r.negative_prompt.value_or(""), *r.max_sequence_length,
                              {{"prompt_embeds", "negative_prompt_embeds"}}));
  }
  return out;
}

models::TensorMap QwenImagePipeline::encode_text(const TextEncode& encode) const {
  return embeddings_on_cpu(encode_prompt(encode.text, encode.max_sequence_length));
}

namespace {

void warn_qwen_truncation(const QwenImagePipeline::Impl& m, const GenerationRequest& q, const char* field,
                          int64_t max_sequence_length, const models::TensorMap& e) {
  warn_truncated(q, field,
                 fmt::format("`max_sequence_length` is set to {} tokens (after the template's {})",
                             max_sequence_length, kQwenImageDropTokens),
                 tokens_cut(e, "tokens_cut"), m.tp.rank == 0);
}

}  // namespace

void QwenImagePipeline::warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                                        const models::TensorMap& embeddings) const {
  warn_qwen_truncation(*impl_, with_defaults(request), encode.field.c_str(), encode.max_sequence_length, embeddings);
}

namespace {

// The batch's prompt embeddings and masks (and the negative ones under true
// CFG): each prompt encoded alone or taken as given, padded to the longest.
struct QwenPrompts {
  TextBatch positive, negative;
};

QwenPrompts encode_batch(const QwenImagePipeline& pipeline, const QwenImagePipeline::Impl& m,
                         const std::vector<GenerationRequest>& rs, bool cfg) {
  std::vector<at::Tensor> embeds, masks, negative_embeds, negative_masks;
  auto add = [&](const GenerationRequest& q, const char* name, const char* mask_name, const char* field,
                 const std::string& text, std::vector<at::Tensor>& to, std::vector<at::Tensor>& to_masks) {
    if (q.has_given(name)) {
      to.push_back(q.given->at(name).to(m.device, m.dtype));
      to_masks.push_back(q.has_given(mask_name) ? q.given->at(mask_name).to(m.device) : at::Tensor());
      return;
    }
    const models::TensorMap e = pipeline.encode_prompt(text, *q.max_sequence_length);
    warn_qwen_truncation(m, q, field, *q.max_sequence_length, e);
    to.push_back(e.at("prompt_embeds"));
    to_masks.emplace_back();
  };
  for (const auto& q : rs) {
    add(q, "prompt_embeds", "prompt_embeds_mask", "prompt", q.prompt, embeds, masks);
    if (cfg) {
      add(q, "negative_prompt_embeds", "negative_prompt_embeds_mask", "negative_prompt",
          q.negative_prompt.value_or(""), negative_embeds, negative_masks);
    }
  }
  QwenPrompts p;
  p.positive = pad_text_batch(embeds, masks, "prompt_embeds");
  if (cfg) p.negative = pad_text_batch(negative_embeds, negative_masks, "negative_prompt_embeds");
  return p;
}

models::TensorMap text_inputs(const TextBatch& text, const at::Tensor& img_shapes) {
  models::TensorMap in;
  in["encoder_hidden_states"] = text.embeds;
  if (text.mask.defined()) in["encoder_hidden_states_mask"] = text.mask;
  in["img_shapes"] = img_shapes;
  return in;
}

// One image's packed latents to pixels: unpacked to [1, C, 1, h, w], the
// VAE's latent statistics undone as diffusers does it, the frame decoded.
LatentDecoder qwen_image_decoder(const QwenImagePipeline::Impl& m, int64_t height, int64_t width) {
  if (!m.vae) return {};
  return [&m, height, width](const at::Tensor& lat) {
    const c10::ScalarType vdt = checkpoint::parse_compute_dtype(m.vae->compute_dtype(), "vae dtype");
    at::Tensor z = unpack_latents(lat, height, width, m.vae_scale_factor).unsqueeze(2).to(vdt);
    const int64_t c = z.size(1);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor mean = at::tensor(m.latents_mean, f32.dtype(at::kDouble)).to(at::kFloat).view({1, c, 1, 1, 1});
    const at::Tensor std = at::tensor(m.latents_std, f32.dtype(at::kDouble)).to(at::kFloat).view({1, c, 1, 1, 1});
    const at::Tensor inv_std = 1.0 / std.to(z.device(), vdt);
    z = z / inv_std + mean.to(z.device(), vdt);
    return m.vae->decode(z).select(2, 0);
  };
}

}  // namespace

std::vector<GenerationResult> QwenImagePipeline::generate_batch(const std::vector<GenerationRequest>& requests,
                                                                const StepCallback& on_step) const try {
  impl_->need_denoiser("generate_batch");
  if (requests.empty()) return {};
  const std::vector<GenerationRequest> rs = prepare_batch(*this, requests);
  const GenerationRequest& r = rs.front();
  const Impl& m = *impl_;
  const auto& c = m.transformer->config();
  MemoryModel fit;
  fit.pipeline = kClass;
  fit.transformer = {c.heads, c.head_dim, c.mlp_hidden(), c.mlp_hidden(), m.in_channels, m.joint_dim};
  fit.attention_chunk = m.transformer->attention_chunk();
  fit.text_hidden = m.text_encoder ? m.joint_dim : 0;
  if (m.vae) {
    const VaeShape vs = qwen_image_vae_shape(m.vae->config(), m.vae->compute_dtype(), m.device.str(),
                                             m.vae->tiling(), m.vae->tile_sample_size());
    check_batch_fits(*this, rs, fit, m, &vs);
  } else {
    check_batch_fits(*this, rs, fit, m, static_cast<const VaeShape*>(nullptr));
  }
  const int64_t batch = static_cast<int64_t>(rs.size());
  const int64_t steps = *r.steps, height = *r.height, width = *r.width;
  const bool cfg = true_cfg(r);
  StageTimes times;

  // 1. Prompt embeddings and their masks.
  auto t0 = Clock::now();
  const QwenPrompts prompts = encode_batch(*this, m, rs, cfg);
  times.encode_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // 2. Latents (each from its own seed), image shapes, schedule.
  at::Tensor latents = batch_latents(rs, m, [&](const GenerationRequest& q) {
    return prepare_latents(q.seed, 1, m.in_channels / 4, height, width, m.dtype, m.device, m.vae_scale_factor);
  });
  const int64_t h = latent_side(height, m.vae_scale_factor) / 2, w = latent_side(width, m.vae_scale_factor) / 2;
  const at::Tensor img_shapes =
      at::tensor(std::vector<int64_t>{1, h, w}, at::TensorOptions().dtype(at::kLong)).view({1, 3}).repeat({batch, 1});
  FlowMatchEulerDiscreteScheduler scheduler(m.scheduler);
  scheduler.set_timesteps(steps, scheduler.mu_for(h * w));  // mu always passed, as QwenImagePipeline
  models::TensorMap positive = text_inputs(prompts.positive, img_shapes);
  models::TensorMap negative;
  if (cfg) negative = text_inputs(prompts.negative, img_shapes);

  // 3. Denoising (true CFG with the norm rescale).
  latents = denoise([&](const models::TensorMap& x) { return m.transformer->run(x); }, scheduler,
                    latents, positive, cfg ? &negative : nullptr, *r.true_cfg_scale, on_step, times,
                    CfgRescale::kCondNorm);

  // 4. Per image: the NaN check, then decode (on the rank that holds the VAE).
  return finish_batch(latents, height, width, steps, m.dtype_name, qwen_image_decoder(m, height, width),
                      std::move(times));
} catch (...) {
  rethrow_generation_failure(impl_->tp);  // an allocation failure as a request error
}

std::vector<int64_t> QwenImagePipeline::latent_shape(int64_t height, int64_t width) const {
  return {image_seq_len(height, width, impl_->vae_scale_factor), impl_->in_channels};
}
bool QwenImagePipeline::decodes() const { return impl_->vae != nullptr; }
int64_t QwenImagePipeline::transformer_all_reduces() const {
  return impl_->transformer ? impl_->transformer->all_reduces_per_forward() : 0;
}
const PipelineRuntime& QwenImagePipeline::runtime() const { return *impl_; }

TPRUN_REGISTER_PIPELINE(QwenImagePipeline);

namespace {

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

}  // namespace

TPRUN_REGISTER_REQUEST_OPTIONS(QwenImagePipeline::kClass, qwen_image_request_options);

namespace {

// The templated prompt as the pipeline tokenizes it (truncated to 1024 + 34;
// the first 34 tokens never reach the transformer).
std::vector<PromptTokens> qwen_image_tokenize(const std::string& folder, const std::string& prompt,
                                              int64_t max_sequence_length) {
  const auto pf = checkpoint::open_pipeline_folder(folder);
  const auto& tok = need_component(pf, "tokenizer");
  const text::HfTokenizer tokenizer = text::HfTokenizer::load(tok.path, tok.cls);
  tokenizer.require_pad_token(pf.cls);
  text::decode_utf8(prompt, "prompt");
  text::TokenizerBatch tokens = qwen_image_tokens(tokenizer, prompt);
  std::vector<int64_t> ids = std::move(tokens.input_ids.front());
  text::TokenizerOutput out;
  out.untruncated_length = tokens.untruncated_lengths.front();
  // What reaches the transformer: after the dropped tokens, at most max_sequence_length.
  out.attention_mask.assign(ids.size(), 0);
  for (size_t i = static_cast<size_t>(kQwenImageDropTokens);
       i < ids.size() && i < static_cast<size_t>(kQwenImageDropTokens + max_sequence_length); ++i) {
    out.attention_mask[i] = 1;
  }
  out.input_ids = std::move(ids);
  return {{"tokenizer",
           fmt::format("Qwen-Image prompt template (mask: the tokens that reach the transformer, after the first {})",
                       kQwenImageDropTokens),
           std::move(out)}};
}

}  // namespace

TPRUN_REGISTER_PROMPT_TOKENIZER(QwenImagePipeline::kClass, qwen_image_tokenize);

}  // namespace tprun::pipelines
