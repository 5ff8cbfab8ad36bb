#include "pipelines/batch_stages.h"

#include <chrono>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"

namespace tprun::pipelines {

using Clock = std::chrono::steady_clock;

std::vector<GenerationRequest> prepare_batch(const Pipeline& pipeline, const std::vector<GenerationRequest>& requests) {
  std::vector<GenerationRequest> rs;
  rs.reserve(requests.size());
  for (const auto& q : requests) {
    pipeline.check_request(q);
    rs.push_back(pipeline.with_defaults(q));
  }
  for (const auto& q : rs) {
    if (pipeline.batch_key(q) != pipeline.batch_key(rs.front())) {
      throw Error(Error::Kind::Internal,
                  fmt::format("generate_batch: the requests of a batch must share one batch key ('{}' vs '{}')",
                              pipeline.batch_key(rs.front()), pipeline.batch_key(q)));
    }
  }
  return rs;
}

at::Tensor stack_batch(const std::vector<at::Tensor>& tensors, const char* what) {
  for (const auto& t : tensors) {
    if (t.sizes() != tensors.front().sizes()) {
      throw RequestError(fmt::format("the {} of a batch differ in shape", what), true);
    }
  }
  return tensors.size() == 1 ? tensors.front() : at::cat(tensors, 0);
}

at::Tensor denoise(const StepPlan& plan, const std::vector<float>& timesteps, const SchedulerStep& step,
                   at::Tensor latents, models::TensorMap& inputs, models::TensorMap* negative_inputs,
                   const DenoiseStyle& style, const StepCallback& on_step, StageTimes& times, int64_t first,
                   int64_t end) {
  const int64_t steps = static_cast<int64_t>(timesteps.size()), batch = latents.size(0);
  if (end < 0) end = steps;
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(latents.device());
  for (int64_t i = first; i < end; ++i) {
    const auto t0 = Clock::now();
    const float ts = timesteps[static_cast<size_t>(i)];
    const at::Tensor t = style.timestep_thousandths ? at::full({batch}, ts, fopts).to(latents.scalar_type()) / 1000
                                                    : at::full({batch}, ts, fopts);
    const at::Tensor x =
        style.input_dtype && *style.input_dtype != latents.scalar_type() ? latents.to(*style.input_dtype) : latents;
    const DenoiseStep run = plan(i, ts);
    inputs["hidden_states"] = x;
    inputs["timestep"] = t;
    at::Tensor noise = (*run.transformer)(inputs);
    if (negative_inputs) {
      (*negative_inputs)["hidden_states"] = x;
      (*negative_inputs)["timestep"] = t;
      const at::Tensor neg = (*run.transformer)(*negative_inputs);
      at::Tensor comb = neg + run.cfg_scale * (noise - neg);
      if (style.rescale == CfgRescale::kCondNorm) {
        // torch.norm(x, dim=-1, keepdim=True): the 2-norm over the channels.
        comb = comb * (at::linalg_vector_norm(noise, 2, {-1}, true) / at::linalg_vector_norm(comb, 2, {-1}, true));
      }
      noise = comb;
    }
    latents = step(noise, i, latents);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    times.step_s.push_back(secs);
    if (on_step) on_step(i, steps, secs);
  }
  return latents;
}

std::string non_finite_hint(const std::string& dtype_name) {
  if (dtype_name == "fp16") return "fp16's range is narrow: try bf16 or fp32";
  if (dtype_name == "bf16") return "bf16 rounds coarsely: try fp32";
  // Not a precision limit: what went in was out of range.
  return "fp32 is not the cause: check the model's weights, any given tensors (--inputs) and the scheduler config";
}

namespace {

// The decoder's output in [-1, 1], [1, 3, H, W] (an image) or [1, 3, F, H, W]
// (frames), as float frames [F, H, W, 3] in [0, 1] on the CPU. An image
// takes exactly the ops it always took.
at::Tensor decoded_frames(const at::Tensor& x) {
  if (x.dim() == 4) {
    return (x.to(at::kFloat) / 2 + 0.5).clamp(0, 1).permute({0, 2, 3, 1}).contiguous().cpu();
  }
  if (x.dim() == 5 && x.size(0) == 1 && x.size(1) == 3 && x.size(2) >= 1) {
    return (x.to(at::kFloat) / 2 + 0.5).clamp(0, 1).permute({0, 2, 3, 4, 1}).squeeze(0).contiguous().cpu();
  }
  throw Error(Error::Kind::Internal,
              fmt::format("finish_batch: the decoder gave [{}]; expected [1, 3, H, W] or [1, 3, F, H, W]",
                          fmt::join(x.sizes(), ", ")));
}

}  // namespace

namespace {

// The decoded frames of one result into `out`: float [F, H, W, 3], bytes, F.
void set_frames(GenerationResult& out, const at::Tensor& decoded) {
  const at::Tensor image = decoded_frames(decoded);
  const at::Tensor bytes = (image * 255).round().to(at::kByte).contiguous();
  out.rgb.assign(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
  out.frames = image.size(0);
  out.image = std::make_shared<at::Tensor>(image);
}

// Per result: sizes, the NaN/Inf check (error set) or the latents kept.
// Returns the indices of the finite results.
std::vector<int64_t> check_results(std::vector<GenerationResult>& res, const at::Tensor& latents, int64_t height,
                                   int64_t width, int64_t steps, const std::string& dtype_name) {
  const int64_t batch = latents.size(0);
  std::vector<int64_t> finite;
  for (int64_t b = 0; b < batch; ++b) {
    GenerationResult& out = res[static_cast<size_t>(b)];
    out.height = height;
    out.width = width;
    const at::Tensor lat = batch == 1 ? latents : latents.slice(0, b, b + 1).contiguous();
    if (!at::isfinite(lat).all().item<bool>()) {
      out.error = fmt::format("the latents hold NaN or Inf after {} steps (dtype {}); {}", steps, dtype_name,
                              non_finite_hint(dtype_name));
      continue;
    }
    out.latents = std::make_shared<at::Tensor>(lat);
    finite.push_back(b);
  }
  return finite;
}

// Each result charged an equal share of the batch's stage times.
void share_times(std::vector<GenerationResult>& res, const StageTimes& times) {
  const double share = 1.0 / static_cast<double>(res.size());
  for (auto& out : res) {
    out.times.encode_s = times.encode_s * share;
    out.times.decode_s = times.decode_s * share;
    for (double s : times.step_s) out.times.step_s.push_back(s * share);
    out.batch_size = static_cast<int64_t>(res.size());
  }
}

}  // namespace

std::vector<GenerationResult> finish_batch(const at::Tensor& latents, int64_t height, int64_t width, int64_t steps,
                                           const std::string& dtype_name, const LatentDecoder& decode,
                                           StageTimes times) {
  std::vector<GenerationResult> res(static_cast<size_t>(latents.size(0)));
  const auto t0 = Clock::now();
  for (int64_t b : check_results(res, latents, height, width, steps, dtype_name)) {
    if (decode) set_frames(res[static_cast<size_t>(b)], decode(*res[static_cast<size_t>(b)].latents));
  }
  if (decode) times.decode_s = std::chrono::duration<double>(Clock::now() - t0).count();
  share_times(res, times);
  return res;
}

std::vector<GenerationResult> finish_batch_together(const at::Tensor& latents, int64_t height, int64_t width,
                                                    int64_t steps, const std::string& dtype_name,
                                                    const BatchDecoder& decode, StageTimes times) {
  std::vector<GenerationResult> res(static_cast<size_t>(latents.size(0)));
  const auto t0 = Clock::now();
  const std::vector<int64_t> finite = check_results(res, latents, height, width, steps, dtype_name);
  if (decode && !finite.empty()) {
    std::vector<at::Tensor> parts;
    for (int64_t b : finite) parts.push_back(*res[static_cast<size_t>(b)].latents);
    const at::Tensor decoded = decode(parts.size() == 1 ? parts.front() : at::cat(parts, 0));
    if (decoded.defined()) {
      for (size_t k = 0; k < finite.size(); ++k) {
        set_frames(res[static_cast<size_t>(finite[k])], decoded.slice(0, static_cast<int64_t>(k),
                                                                      static_cast<int64_t>(k) + 1));
      }
    }
    times.decode_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  share_times(res, times);
  return res;
}

void note_tokens_cut(models::TensorMap& embeds, const std::string& key, int64_t untruncated, int64_t max_length) {
  if (untruncated > max_length) embeds[key] = at::scalar_tensor(untruncated - max_length, at::kLong);
}

int64_t tokens_cut(const models::TensorMap& embeds, const std::string& key) {
  auto it = embeds.find(key);
  return it == embeds.end() ? 0 : it->second.item<int64_t>();
}

void warn_truncated(const GenerationRequest& request, const char* field, const std::string& because, int64_t cut,
                    bool leader) {
  if (cut <= 0 || !leader) return;
  spdlog::warn("{}the {} was truncated because {} ({} token{} dropped)",
               request.id.empty() ? std::string() : "request " + request.id + ": ", field, because, cut,
               cut == 1 ? "" : "s");
}

void warn_max_sequence_truncated(const GenerationRequest& request, const char* field, int64_t max_sequence_length,
                                 const models::TensorMap& encoded, const std::string& key, bool leader) {
  warn_truncated(request, field, fmt::format("`max_sequence_length` is set to {} tokens", max_sequence_length),
                 tokens_cut(encoded, key), leader);
}

at::Tensor stack_text(const std::vector<models::TensorMap>& per_request, const std::string& name,
                      const std::string& prefix) {
  std::vector<at::Tensor> tensors;
  for (const auto& m : per_request) tensors.push_back(m.at(name));
  return stack_batch(tensors, (prefix + name).c_str());
}

}  // namespace tprun::pipelines
