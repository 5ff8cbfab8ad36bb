#include "pipelines/batch_stages.h"

#include <chrono>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "pipelines/flow_match_scheduler.h"
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

at::Tensor denoise(const TransformerCall& transformer, const FlowMatchEulerDiscreteScheduler& scheduler,
                   at::Tensor latents, models::TensorMap& inputs, models::TensorMap* negative_inputs,
                   double cfg_scale, const StepCallback& on_step, StageTimes& times, CfgRescale rescale) {
  const auto& timesteps = scheduler.timesteps();
  const int64_t steps = static_cast<int64_t>(timesteps.size()), batch = latents.size(0);
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(latents.device());
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    const at::Tensor t = at::full({batch}, timesteps[static_cast<size_t>(i)], fopts).to(latents.scalar_type()) / 1000;
    inputs["hidden_states"] = latents;
    inputs["timestep"] = t;
    at::Tensor noise = transformer(inputs);
    if (negative_inputs) {
      (*negative_inputs)["hidden_states"] = latents;
      (*negative_inputs)["timestep"] = t;
      const at::Tensor neg = transformer(*negative_inputs);
      at::Tensor comb = neg + cfg_scale * (noise - neg);
      if (rescale == CfgRescale::kCondNorm) {
        // torch.norm(x, dim=-1, keepdim=True): the 2-norm over the channels.
        comb = comb * (at::linalg_vector_norm(noise, 2, {-1}, true) / at::linalg_vector_norm(comb, 2, {-1}, true));
      }
      noise = comb;
    }
    latents = scheduler.step(noise, i, latents);
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

std::vector<GenerationResult> finish_batch(const at::Tensor& latents, int64_t height, int64_t width, int64_t steps,
                                           const std::string& dtype_name, const LatentDecoder& decode,
                                           StageTimes times) {
  const int64_t batch = latents.size(0);
  std::vector<GenerationResult> res(static_cast<size_t>(batch));
  const auto t0 = Clock::now();
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
    if (!decode) continue;
    const at::Tensor image = decoded_frames(decode(lat));
    const at::Tensor bytes = (image * 255).round().to(at::kByte).contiguous();
    out.rgb.assign(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
    out.frames = image.size(0);
    out.image = std::make_shared<at::Tensor>(image);
  }
  if (decode) times.decode_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double share = 1.0 / static_cast<double>(batch);
  for (auto& out : res) {
    out.times.encode_s = times.encode_s * share;
    out.times.decode_s = times.decode_s * share;
    for (double s : times.step_s) out.times.step_s.push_back(s * share);
    out.batch_size = batch;
  }
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

}  // namespace tprun::pipelines
