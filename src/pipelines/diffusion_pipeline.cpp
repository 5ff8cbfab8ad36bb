// The generate skeleton (see diffusion_pipeline.h).
#include "pipelines/diffusion_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "models/denoiser.h"
#include "models/vae.h"
#include "pipelines/component_check.h"
#include "pipelines/component_configs.h"
#include "pipelines/component_loader.h"
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/latents.h"
#include "pipelines/request_memory.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::pipelines {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kNegative = "negative_";

// One encode a request needs: `field` ("prompt" | "negative_prompt") with its
// text, keyed by prompt_key, and the (encode_text name, given name) pairs.
TextEncode text_encode(const std::string& field, const std::string& text, int64_t max_sequence_length,
                       std::vector<std::pair<std::string, std::string>> gives) {
  TextEncode e;
  e.field = field;
  e.text = text;
  e.max_sequence_length = max_sequence_length;
  e.key = prompt_key(text, max_sequence_length);
  e.gives = std::move(gives);
  return e;
}

// RequestError unless steps is in [1, 10000] and guidance, where set, is finite.
void check_steps_and_guidance(const GenerationRequest& r) {
  if (*r.steps < 1) throw RequestError(fmt::format("steps must be at least 1, got {}", *r.steps), true);
  if (*r.steps > 10000) throw RequestError(fmt::format("steps {} is beyond the limit of 10000", *r.steps), true);
  if (r.guidance && !std::isfinite(*r.guidance)) throw RequestError("guidance must be a finite number", true);
  if (r.true_cfg_scale && !std::isfinite(*r.true_cfg_scale)) {
    throw RequestError("true_cfg_scale must be a finite number", true);
  }
}

}  // namespace

std::string prompt_key(const std::string& text, int64_t max_sequence_length) {
  return fmt::format("{}\n{}", max_sequence_length, text);
}

DiffusionPipeline::DiffusionPipeline() = default;
DiffusionPipeline::~DiffusionPipeline() = default;

void DiffusionPipeline::load_folder(const std::string& folder, const parallel::TpContext& tp,
                                    const PipelineOptions& options) {
  const checkpoint::PipelineFolder pf = open_registered_folder(folder);
  ctx_.init(pf.path, tp, options);
  cls_ = pf.cls;
  spec_ = find_pipeline_spec(pf.cls);
  check_pipeline_components(pf);
  // Configs first: every cross-component check before any weight byte is read.
  const ComponentConfigs configs = read_component_configs(pf, *spec_, options);
  shapes_ = configs.shapes();
  vae_scale_ = configs.vae().spatial_scale;
  scheduler_path_ = need_component(pf, "scheduler").path + "/scheduler_config.json";
  scheduler_fallback_ = need_component(pf, "scheduler").cls;
  scheduler_config_ = read_json_file(scheduler_path_, "scheduler config");
  make_batch_scheduler();  // its config checked now, before any weight byte
  request_ = request_options(pf);
  configure(configs, options);
  // The weights: every TP plan first, then this rank's components.
  LoadedComponents parts = load_components(pf, *spec_, configs, ctx_.tp, options);
  ctx_.bytes += parts.bytes;
  for (const char* name : {"transformer", "text_encoder", "text_encoder_2"}) {
    if (configs.has(name)) lora_configs_[name] = configs.at(name).json;
  }
  transformer_ = parts.take<models::Denoiser>("transformer");
  if (transformer_) attention_chunk_ = transformer_->attention_chunk();
  vae_ = parts.take<models::Vae>("vae");
  text_->take(parts);
  take_more(parts);
}

GenerationRequest DiffusionPipeline::with_defaults(GenerationRequest r) const {
  r.fill_from(request_.request_defaults(spec_->defaults.request(vae_scale_)));
  return r;
}

std::string DiffusionPipeline::batch_key(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  const bool cfg = true_cfg(g);
  std::string key = fmt::format("{}x{}/{}/{}/{}/{}", *g.height, *g.width, *g.steps,
                                g.guidance ? fmt::format("g{}", *g.guidance) : "-",
                                cfg ? fmt::format("cfg{}", cfg_scale(g)) : "nocfg", *g.max_sequence_length);
  if (g.frame_count() != 1) key += fmt::format("/f{}", g.frame_count());
  const std::string extra = batch_key_extra(g);
  if (!extra.empty()) key += "/" + extra;
  // A batch never mixes adapter sets.
  if (!g.lora_set().empty()) key += "/lora:" + lora::lora_set_key(g.lora_set());
  return key;
}

void DiffusionPipeline::prepare_loras(const std::vector<std::vector<LoraChoice>>& sets, bool strict,
                                      const std::string& apply) {
  const lora::LoraApply mode = lora::parse_lora_apply(apply, "lora_apply");
  if (loras_) throw Error(Error::Kind::Internal, "prepare_loras called twice");
  bool any = false;
  for (const auto& set : sets) any = any || !set.empty();
  if (!any) return;
  // The encode phase of a staged job (no transformer) runs no adapter: the
  // denoise phase's pipeline prepares them (and refuses text-encoder keys,
  // its text encoders not being loaded).
  if (!ctx_.denoiser || !transformer_) return;
  std::vector<lora::LoraComponent> components;
  lora::LoraComponent t;
  t.component = "transformer";
  t.model = transformer_.get();
  t.config = &lora_configs_.at("transformer");
  t.reloads = reloads("transformer");
  t.dropped_prefixes = text_->lora_dropped_prefixes();
  components.push_back(t);
  for (const auto& [name, model] : text_->lora_encoders()) {
    auto config = lora_configs_.find(name);
    if (!model || config == lora_configs_.end()) continue;
    components.push_back({name, model, &config->second, {}, false});
  }
  loras_ = std::make_unique<lora::LoraAdapters>(std::move(components));
  loras_->prepare(sets, strict, mode);
}

void DiffusionPipeline::use_loras(const GenerationRequest& r) const {
  if (!loras_) {
    if (!r.lora_set().empty()) {
      throw Error(Error::Kind::Internal, fmt::format("request '{}' names adapters that were not prepared", r.id));
    }
    return;
  }
  loras_->activate(r.lora_set());
  bool text = false;
  for (const auto& [name, model] : text_->lora_encoders()) text = text || loras_->adapts(name);
  text_lora_key_ = text ? lora::lora_set_key(r.lora_set()) : std::string();
}

lora::LoraStats DiffusionPipeline::lora_stats() const { return loras_ ? loras_->stats() : lora::LoraStats{}; }

void DiffusionPipeline::rebind_loras(const std::string& component, const models::Model* model) const {
  if (loras_) loras_->rebind(component, model);
}

double DiffusionPipeline::cost(const GenerationRequest& request) const {
  const GenerationRequest g = with_defaults(request);
  return static_cast<double>(*g.height) * static_cast<double>(*g.width) * static_cast<double>(*g.steps) *
         (true_cfg(g) ? 2.0 : 1.0) * static_cast<double>(g.frame_count());
}

void DiffusionPipeline::check_request(const GenerationRequest& request) const {
  const GenerationRequest r = with_defaults(request);
  need_request_options(r, request_);
  check_image_size(*r.height, *r.width, vae_scale_);
  check_steps_and_guidance(r);
  check_max_sequence_length(r, cls_, request_.max_sequence_length);
  const std::vector<TextTensor>& tensors = text_->tensors();
  const std::string& primary = tensors.front().name;
  std::vector<std::string> required, known;
  for (const auto& t : tensors)
    if (!t.mask) required.push_back(t.name);
  std::vector<std::string> prefixes = {""};
  if (has_negative()) prefixes.push_back(kNegative);
  for (const std::string& prefix : prefixes) {
    for (const auto& t : tensors) known.push_back(prefix + t.name);
    if (required.size() < 2) continue;
    bool any = false, all = true;
    for (const auto& name : required) {
      any = any || r.has_given(prefix + name);
      all = all && r.has_given(prefix + name);
    }
    if (any && !all) {
      std::vector<std::string> names;
      for (const auto& name : required) names.push_back(prefix + name);
      throw RequestError(fmt::format("{} must be given together", fmt::join(names, " and ")), true);
    }
  }
  known.push_back("latents");
  if (!r.has_given(primary) && !text_->loaded()) {
    throw RequestError(fmt::format("{} was loaded without {}: give {}", ctx_.folder, text_->encoders_name(),
                                   fmt::join(required, " and ")),
                       true);
  }
  need_text_prompts(r);
  for (const std::string& prefix : prefixes) {
    for (const auto& t : tensors) {
      const std::string name = prefix + t.name;
      if (!t.mask) {
        need_given_shape(r, name, t.shape, t.meaning);
        continue;
      }
      if (!r.has_given(name)) continue;
      const std::string of = prefix + primary;
      if (!r.has_given(of)) throw RequestError(fmt::format("{} is given without {}", name, of), true);
      need_given_shape(r, name, {1, r.given->at(of).size(1)}, fmt::format("[1, the text tokens of {}]", of));
    }
  }
  std::vector<int64_t> latents_shape = {1};
  for (int64_t d : request_latent_shape(r)) latents_shape.push_back(d);
  need_given_shape(r, "latents", latents_shape, latents_meaning());
  if (true_cfg(r) && !r.has_given(kNegative + primary) && !text_->loaded()) {
    throw RequestError(fmt::format("true CFG needs {}{} when the pipeline is loaded without {}", kNegative, primary,
                                   text_->encoders_name()),
                       true);
  }
  for (const auto& [name, t] : r.given ? *r.given : models::TensorMap{}) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw RequestError(fmt::format("given tensor '{}' is not one of {}", name, fmt::join(known, ", ")), true);
    }
  }
  check_family_request(r);
}

models::TensorMap DiffusionPipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length) const {
  if (!text_->loaded()) {
    throw RequestError(fmt::format("{} was loaded without {}", ctx_.folder, text_->encoders_name()), true);
  }
  const std::string key = prompt_key(prompt, max_sequence_length) + text_lora_key_;
  if (auto hit = ctx_.cache->get(key)) return *hit;
  models::TensorMap out = text_->encode(prompt, max_sequence_length);
  ctx_.cache->put(key, out);
  return out;
}

std::vector<TextEncode> DiffusionPipeline::text_encodes(const GenerationRequest& request) const {
  const GenerationRequest r = with_defaults(request);
  std::vector<std::pair<std::string, std::string>> gives, negative_gives;
  for (const auto& t : text_->tensors()) {
    if (t.mask) continue;
    gives.emplace_back(t.name, t.name);
    negative_gives.emplace_back(t.name, kNegative + t.name);
  }
  const std::string& primary = text_->tensors().front().name;
  std::vector<TextEncode> out;
  if (!r.has_given(primary)) out.push_back(text_encode("prompt", r.prompt, *r.max_sequence_length, gives));
  if (true_cfg(r) && !r.has_given(kNegative + primary)) {
    out.push_back(
        text_encode("negative_prompt", r.negative_prompt.value_or(""), *r.max_sequence_length, negative_gives));
  }
  return out;
}

models::TensorMap DiffusionPipeline::encode_text(const TextEncode& encode) const {
  models::TensorMap out;
  // Every tensor on the CPU and contiguous, its dtype kept (the values are copied exactly).
  for (const auto& [name, t] : encode_prompt(encode.text, encode.max_sequence_length)) out[name] = t.cpu().contiguous();
  text_->add_carried(out);
  return out;
}

void DiffusionPipeline::warn_truncation(const GenerationRequest& request, const TextEncode& encode,
                                        const models::TensorMap& embeddings) const {
  text_->warn_truncation(with_defaults(request), encode.field.c_str(), encode.max_sequence_length, embeddings,
                         ctx_.tp.rank == 0);
}

DiffusionPipeline::TextInputs DiffusionPipeline::encode_batch(const std::vector<GenerationRequest>& rs,
                                                              bool cfg) const {
  std::vector<models::TensorMap> positive, negative;
  const std::vector<TextTensor>& tensors = text_->tensors();
  // One prompt's tensors: given under `prefix`, else encoded from `text`.
  auto add = [&](const GenerationRequest& q, const std::string& prefix, const char* field, const std::string& text,
                 std::vector<models::TensorMap>& to) {
    if (q.has_given(prefix + tensors.front().name)) {
      models::TensorMap m;
      for (const auto& t : tensors) {
        if (!q.has_given(prefix + t.name)) continue;
        const at::Tensor& g = q.given->at(prefix + t.name);
        m[t.name] = t.mask ? g.to(ctx_.device) : g.to(ctx_.device, ctx_.dtype);
      }
      to.push_back(std::move(m));
      return;
    }
    models::TensorMap e = encode_prompt(text, *q.max_sequence_length);
    text_->warn_truncation(q, field, *q.max_sequence_length, e, ctx_.tp.rank == 0);
    to.push_back(std::move(e));
  };
  for (const auto& q : rs) {
    add(q, "", "prompt", q.prompt, positive);
    if (cfg) add(q, kNegative, "negative_prompt", q.negative_prompt.value_or(""), negative);
  }
  TextInputs in;
  in.positive = text_->batch(positive, "");
  if (cfg) in.negative = text_->batch(negative, kNegative);
  return in;
}

void DiffusionPipeline::check_batch_fits(const std::vector<GenerationRequest>& rs) const {
  MemoryModel fit;
  fit.pipeline = cls_;
  fit.transformer = shapes_.transformer;
  fit.attention_chunk = attention_chunk_;
  fit.text_hidden = text_->loaded() ? shapes_.text_hidden : 0;
  fit.tp_size = ctx_.tp.size;
  fit.weights_bytes = ctx_.bytes;
  const std::string device = ctx_.device.str();
  const VaeShape vae = vae_ ? vae_->memory_shape(device) : VaeShape{};
  fill_runtime(fit, device, ctx_.dtype_name, vae_ ? &vae : nullptr);
  check_batch_memory(fit, batch_shape(*this, rs), ctx_.tp, device);
}

at::Tensor DiffusionPipeline::draw_latents(const GenerationRequest& q) const {
  return prepare_latents(q.seed, 1, shapes_.transformer.in_channels / 4, *q.height, *q.width, ctx_.dtype, ctx_.device,
                         vae_scale_);
}

// A batch between its parts (Pipeline::InFlight): the prepared requests,
// their text inputs, the latents and the scheduler with its history.
struct DiffusionPipeline::BatchRun final : Pipeline::InFlight {
  std::vector<GenerationRequest> rs;
  bool cfg = false;
  TextInputs in;
  at::Tensor latents;
  std::unique_ptr<Scheduler> scheduler;
  StepCallback on_step;
  StageTimes times;
  int64_t next_step = 0;
};

std::vector<GenerationResult> DiffusionPipeline::generate_batch(const std::vector<GenerationRequest>& requests,
                                                                const StepCallback& on_step) const {
  if (requests.empty()) return {};
  std::unique_ptr<InFlight> b = start_batch(requests, on_step);
  for (int64_t s = 0; s < denoise_stages(); ++s) advance_batch(*b, s);
  return finish_in_flight(*b);
}

std::unique_ptr<Pipeline::InFlight> DiffusionPipeline::start_batch(const std::vector<GenerationRequest>& requests,
                                                                   const StepCallback& on_step) const try {
  ctx_.need_denoiser("generate_batch");
  if (requests.empty()) throw Error(Error::Kind::Internal, "start_batch of no requests");
  auto b = std::make_unique<BatchRun>();
  b->rs = prepare_batch(*this, requests);
  b->on_step = on_step;
  const GenerationRequest& r = b->rs.front();
  check_batch_fits(b->rs);
  const int64_t batch = static_cast<int64_t>(b->rs.size());
  const int64_t steps = *r.steps, height = *r.height, width = *r.width;
  b->cfg = true_cfg(r);

  // 1. Prompt embeddings (with the batch's adapters where they reach a text encoder).
  use_loras(r);
  auto t0 = Clock::now();
  b->in = encode_batch(b->rs, b->cfg);
  b->times.encode_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // 2. Latents (each given or from its own seed), schedule, the transformer's inputs.
  std::vector<at::Tensor> per_request;
  for (const auto& q : b->rs) {
    per_request.push_back(q.has_given("latents") ? q.given->at("latents").to(ctx_.device, latents_dtype())
                                                 : draw_latents(q));
  }
  b->latents = stack_batch(per_request, "latents");
  b->scheduler = make_batch_scheduler();
  const std::optional<double> mu = schedule_mu(*b->scheduler, image_seq_len(height, width, vae_scale_), steps);
  if (scheduler_own_timesteps()) {
    b->scheduler->set_own_timesteps(steps, mu);
  } else {
    b->scheduler->set_timesteps(steps, mu);
  }
  add_transformer_inputs(b->in.positive, r, batch);
  if (b->cfg) add_transformer_inputs(b->in.negative, r, batch);
  return b;
} catch (...) {
  rethrow_generation_failure(ctx_.tp);  // an allocation failure as a request error
}

// 3. Denoising: the steps of `stage`, each step's transformer (and CFG scale) as the family says. The last
//    weight stage runs every step left: with its weights resident (one weight stage) a two-expert family's
//    stage 0 is the whole schedule, as a job runs it (one advance_batch per weight stage).
void DiffusionPipeline::advance_batch(InFlight& batch, int64_t stage) const try {
  auto& b = dynamic_cast<BatchRun&>(batch);
  const std::vector<float>& timesteps = b.scheduler->timesteps();
  const int64_t n = static_cast<int64_t>(timesteps.size());
  const bool last = stage + 1 >= weight_stages();
  int64_t end = b.next_step;
  while (end < n && (last || step_stage(timesteps[static_cast<size_t>(end)]) <= stage)) ++end;
  if (end == b.next_step) return;
  hold_stage(stage);
  const GenerationRequest& r = b.rs.front();
  // This batch's adapters (one set per batch: batch_key) in force for its steps.
  use_loras(r);
  std::map<const models::Denoiser*, TransformerCall> calls;
  const StepPlan plan = [&](int64_t, float t) {
    const models::Denoiser* d = &step_transformer(t);
    auto it = calls.find(d);
    if (it == calls.end()) it = calls.emplace(d, [d](const models::TensorMap& x) { return d->run(x); }).first;
    return DenoiseStep{&it->second, b.cfg ? step_cfg_scale(r, t) : 1.0};
  };
  const SchedulerStep step = [&](const at::Tensor& noise, int64_t i, const at::Tensor& x) {
    return b.scheduler->step(noise, i, x);
  };
  b.latents = denoise(plan, timesteps, step, b.latents, b.in.positive, b.cfg ? &b.in.negative : nullptr,
                      denoise_style(), b.on_step, b.times, b.next_step, end);
  b.next_step = end;
} catch (...) {
  rethrow_generation_failure(ctx_.tp);
}

// 4. Per result: the NaN check, then decode (on the rank that holds the VAE, or split over the TP group).
std::vector<GenerationResult> DiffusionPipeline::finish_in_flight(InFlight& batch) const try {
  auto& b = dynamic_cast<BatchRun&>(batch);
  const int64_t n = static_cast<int64_t>(b.scheduler->timesteps().size());
  if (b.next_step != n) {
    throw Error(Error::Kind::Internal, fmt::format("a batch finished after {} of its {} steps", b.next_step, n));
  }
  const GenerationRequest& r = b.rs.front();
  const int64_t steps = *r.steps, height = *r.height, width = *r.width, frames = r.frame_count();
  if (BatchDecoder together = vae_ ? batch_decoder(height, width, frames) : BatchDecoder{}) {
    return finish_batch_together(b.latents, height, width, steps, ctx_.dtype_name, together, std::move(b.times));
  }
  LatentDecoder decode;
  if (vae_) decode = [this, height, width](const at::Tensor& lat) { return decode_latents(lat, height, width); };
  return finish_batch(b.latents, height, width, steps, ctx_.dtype_name, decode, std::move(b.times));
} catch (...) {
  rethrow_generation_failure(ctx_.tp);
}

DenoiseStyle DiffusionPipeline::denoise_style() const {
  DenoiseStyle style;
  style.rescale = cfg_rescale();
  return style;
}

const models::Denoiser& DiffusionPipeline::step_transformer(float) const { return *transformer_; }

std::string DiffusionPipeline::latents_meaning() const {
  return "packed latents [1, image tokens, in_channels] for this height and width";
}

std::unique_ptr<Scheduler> DiffusionPipeline::make_batch_scheduler() const {
  return make_scheduler(scheduler_config_, scheduler_path_, scheduler_fallback_);
}

const FlowMatchEulerDiscreteScheduler& DiffusionPipeline::flow_match(const Scheduler& scheduler) {
  const auto* fm = dynamic_cast<const FlowMatchEulerDiscreteScheduler*>(&scheduler);
  if (!fm) {
    throw Error(Error::Kind::Internal,
                fmt::format("this pipeline runs FlowMatchEulerDiscreteScheduler only, yet was given {}",
                            scheduler.class_name()));
  }
  return *fm;
}

std::vector<int64_t> DiffusionPipeline::latent_shape(int64_t height, int64_t width) const {
  return {image_seq_len(height, width, vae_scale_), shapes_.transformer.in_channels};
}

bool DiffusionPipeline::decodes() const { return vae_ != nullptr; }

int64_t DiffusionPipeline::transformer_all_reduces() const {
  return transformer_ ? transformer_->all_reduces_per_forward() : 0;
}

}  // namespace tprun::pipelines
