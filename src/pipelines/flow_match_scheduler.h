#pragma once
// diffusers' FlowMatchEulerDiscreteScheduler as FluxPipeline drives it (a Scheduler: scheduler.h).
//
// Configured from a pipeline's scheduler/scheduler_config.json. FluxPipeline
// calls set_timesteps(sigmas = linspace(1, 1/n, n), mu = calculate_shift(image
// sequence length)); that is what set_timesteps(n, mu) does here:
//   sigmas (float32)  <- linspace(1, 1/n, n), computed in double, rounded once
//   dynamic shifting  <- exponential: e^mu / (e^mu + (1/s - 1))   (sigma 1.0)
//                        linear:      mu   / (mu   + (1/s - 1))
//   static shift      <- shift * s / (1 + (shift - 1) * s)   (no dynamic shifting)
//   shift_terminal    <- 1 - (1 - s) / ((1 - s_last) / (1 - shift_terminal)), if set
//   timesteps         <- sigmas * num_train_timesteps (float32)
//   terminal sigma    <- 0 appended (1 with invert_sigmas, after s <- 1 - s)
// All of it in float32 arithmetic, as diffusers does it in numpy float32, so the
// schedule matches diffusers' to the float32 ulp.
//
// Not implemented, and refused with a CheckpointError naming the field when true:
// use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas, stochastic_sampling.
// Bounded at load (CheckpointError naming the file and key): shift in
// (0, 1000], base_shift and max_shift in [-10, 10], the image sequence
// lengths in [0, 2^24]. A schedule that still comes out non-finite, or a
// shift_terminal stretch of a schedule whose last sigma is 1 (one step:
// diffusers divides by zero there), is a RequestError.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipelines/scheduler.h"

namespace tprun::pipelines {

struct FlowMatchSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::optional<double> shift_terminal;  // null / absent: no stretch
  std::string time_shift_type = "exponential";  // "exponential" | "linear"

  // Missing fields take diffusers' defaults (above); unknown fields are
  // ignored, as diffusers ignores them. CheckpointError "<source>: <field> ..."
  // for a wrong type or value, or a feature tprun does not implement.
  static FlowMatchSchedulerConfig from_json(const nlohmann::json& config, const std::string& source);
  // Reads <path> (e.g. <pipeline>/scheduler/scheduler_config.json).
  static FlowMatchSchedulerConfig from_file(const std::string& path);
};

// FluxPipeline's calculate_shift: mu = L * m + b with
// m = (max_shift - base_shift) / (max_seq_len - base_seq_len), b = base_shift - m * base_seq_len.
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len = 256, int64_t max_seq_len = 4096,
                       double base_shift = 0.5, double max_shift = 1.15);

class FlowMatchEulerDiscreteScheduler : public Scheduler {
 public:
  explicit FlowMatchEulerDiscreteScheduler(FlowMatchSchedulerConfig config);

  std::string class_name() const override { return "FlowMatchEulerDiscreteScheduler"; }
  bool uses_dynamic_shifting() const override { return config_.use_dynamic_shifting; }
  // 2 with shift_terminal (it stretches by 1 - the last sigma, 0 for one step), else 1.
  StepLimit step_limit() const override;

  const FlowMatchSchedulerConfig& config() const { return config_; }

  // calculate_shift with this config's base/max sequence lengths and shifts.
  double mu_for(int64_t image_seq_len) const;

  // The schedule of `num_inference_steps` steps as FluxPipeline sets it up.
  // `mu` is required with use_dynamic_shifting (ConfigError otherwise, as in
  // diffusers) and ignored without it. RequestError for num_inference_steps < 1.
  void set_timesteps(int64_t num_inference_steps, std::optional<double> mu) override;
  // diffusers' own schedule, as WanPipeline asks for it (set_timesteps(n) with
  // no sigmas): t <- linspace(sigma_max T, sigma_min T, n) in float64, where
  // sigma_max / sigma_min are the ends of __init__'s training sigmas
  // (float32, statically shifted unless use_dynamic_shifting); sigmas <- t / T,
  // then shifted (again) and stretched in float64 as above, stored float32.
  void set_own_timesteps(int64_t num_inference_steps, std::optional<double> mu) override;
  // Same with explicit input sigmas (FluxPipeline's `sigmas=` argument).
  void set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu);

  int64_t num_inference_steps() const { return static_cast<int64_t>(timesteps_.size()); }
  // [n] float32 values, and the [n + 1] sigmas (last: the terminal value).
  const std::vector<float>& timesteps() const override { return timesteps_; }
  const std::vector<float>& sigmas() const override { return sigmas_; }
  // As CPU float32 tensors ([n], [n + 1]).
  at::Tensor timesteps_tensor() const;
  at::Tensor sigmas_tensor() const;

  // One Euler step from step `step_index` (0-based position in timesteps()):
  //   prev = float32(sample) + (sigma[i+1] - sigma[i]) * model_output
  // with (sigma[i+1] - sigma[i]) a float32 0-d tensor, so the product takes
  // model_output's dtype and the sum float32 (torch's promotion, as in
  // diffusers); the result is cast back to model_output's dtype, as diffusers
  // does (in FluxPipeline it equals the latents' dtype). Error (internal) for
  // an index outside [0, n) or before set_timesteps.
  // Euler keeps no history: the step is the same from a const scheduler, and
  // the Scheduler override is this one.
  at::Tensor step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample) const;
  at::Tensor step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample) override {
    return static_cast<const FlowMatchEulerDiscreteScheduler&>(*this).step(model_output, step_index, sample);
  }

 private:
  void finish(std::vector<float> sigmas, std::optional<double> mu);
  void store(std::vector<float> sigmas);

  FlowMatchSchedulerConfig config_;
  std::vector<float> timesteps_;
  std::vector<float> sigmas_;
};

}  // namespace tprun::pipelines
