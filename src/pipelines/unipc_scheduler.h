#pragma once
// diffusers' UniPCMultistepScheduler (0.40) as WanPipeline drives it: a
// multistep predictor (UniP) and corrector (UniC) on the data prediction x0
// (predict_x0) or the noise, of order `solver_order`.
//
// Schedule (set_timesteps(n, mu)), as diffusers computes it in numpy float64
// and stores in float32:
//   use_flow_sigmas: s <- linspace(1, 1/T, n + 1)[:n], T = num_train_timesteps;
//     shifted by flow_shift (s' = k s / (1 + (k - 1) s)) or, with
//     use_dynamic_shifting, by mu (exponential e^mu / (e^mu + 1/s - 1), or linear);
//     shift_terminal stretches them; a first sigma within 1e-6 of 1 becomes
//     1 - 1e-6; timesteps <- s * T truncated to integers.
//   otherwise: integer timesteps by timestep_spacing (linspace | leading |
//     trailing, as numpy rounds them: trailing may give one more step than
//     asked, as diffusers does), sigmas the training schedule's
//     sqrt((1 - abar) / abar) at those timesteps (betas linear, scaled_linear,
//     squaredcos_cap_v2 or trained_betas; rescale_betas_zero_snr).
//   The terminal sigma: 0 (final_sigmas_type "zero") or the last/least one ("sigma_min").
//
// Step i (called in order from 0 after set_timesteps): the model output is
// converted (prediction_type epsilon | sample | v_prediction | flow_prediction;
// dynamic thresholding); from step 1 on the corrector refines the sample
// unless i - 1 is in disable_corrector; the history shifts; the predictor of
// order min(solver_order, steps already taken + 1), lower on the last
// steps with lower_order_final, gives the next sample. The coefficients are
// computed as diffusers computes them, in float32 0-d tensors (log, expm1,
// linalg.solve), so a loop matches diffusers' to float32 rounding.
//
// Not implemented, refused with a CheckpointError naming the field:
// use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas, solver_p.
// Refused because diffusers' own result is not finite (NaN / inf on the last
// step): with final_sigmas_type "zero" (the last log-SNR step is infinite)
// solver_type "bh1", predict_x0 false, or lower_order_final false with
// solver_order > 1; with "sigma_min" on flow sigmas (the last step has h = 0)
// lower_order_final false with solver_order > 2.
// Bounded: num_train_timesteps [1, 100000],
// solver_order [1, 4], betas [0, 1), flow_shift (0, 1000], steps_offset
// [0, num_train_timesteps], disable_corrector at most 10000 integers.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "pipelines/scheduler.h"

namespace tprun::pipelines {

struct UniPCSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double beta_start = 0.0001;
  double beta_end = 0.02;
  std::string beta_schedule = "linear";  // "linear" | "scaled_linear" | "squaredcos_cap_v2"
  std::vector<double> trained_betas;     // empty: from beta_schedule
  int64_t solver_order = 2;
  std::string prediction_type = "epsilon";  // "epsilon" | "sample" | "v_prediction" | "flow_prediction"
  bool thresholding = false;
  double dynamic_thresholding_ratio = 0.995;
  double sample_max_value = 1.0;
  bool predict_x0 = true;
  std::string solver_type = "bh2";  // "bh1" | "bh2" (diffusers maps midpoint / heun / logrho to bh2)
  bool lower_order_final = true;
  std::vector<int64_t> disable_corrector;
  bool use_flow_sigmas = false;
  double flow_shift = 1.0;
  std::string timestep_spacing = "linspace";  // "linspace" | "leading" | "trailing"
  int64_t steps_offset = 0;
  std::string final_sigmas_type = "zero";  // "zero" | "sigma_min"
  bool rescale_betas_zero_snr = false;
  bool use_dynamic_shifting = false;
  std::string time_shift_type = "exponential";  // "exponential" | "linear"
  std::optional<double> shift_terminal;         // null / absent: none (0: none, as diffusers tests it for truth)

  // Missing fields take diffusers' defaults (above); unknown ones are ignored,
  // as diffusers ignores them. CheckpointError "<source>: <field> ..." for a
  // wrong type or value, or a feature tprun does not implement.
  static UniPCSchedulerConfig from_json(const nlohmann::json& config, const std::string& source);
  static UniPCSchedulerConfig from_file(const std::string& path);
};

class UniPCMultistepScheduler : public Scheduler {
 public:
  explicit UniPCMultistepScheduler(UniPCSchedulerConfig config);

  const UniPCSchedulerConfig& config() const { return config_; }

  std::string class_name() const override { return "UniPCMultistepScheduler"; }
  bool uses_dynamic_shifting() const override { return config_.use_dynamic_shifting; }
  // 2 with use_flow_sigmas and shift_terminal, else 1.
  StepLimit step_limit() const override;

  // RequestError for steps < 1 (or past 10^6) or a non-finite schedule.
  // Resets the multistep history. As WanPipeline (set_begin_index(0)), step
  // i is timesteps()[i] even where two timesteps are equal.
  void set_timesteps(int64_t steps, std::optional<double> mu) override;
  void set_own_timesteps(int64_t steps, std::optional<double> mu) override { set_timesteps(steps, mu); }
  const std::vector<float>& timesteps() const override { return timesteps_; }
  const std::vector<float>& sigmas() const override { return sigmas_; }

  // The next sample, in `sample`'s dtype (`sample` at least 2-D: [B, C, ...]).
  // Error (internal) for an index other than the next one.
  at::Tensor step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample) override;

 private:
  at::Tensor convert_model_output(const at::Tensor& model_output, const at::Tensor& sample, size_t i) const;
  at::Tensor threshold_sample(const at::Tensor& sample) const;
  at::Tensor predict(const at::Tensor& sample, int64_t order, size_t i) const;
  at::Tensor correct(const at::Tensor& this_output, const at::Tensor& last_sample, int64_t order, size_t i) const;

  UniPCSchedulerConfig config_;
  at::Tensor train_sigmas_;  // [T] float32: sqrt((1 - abar) / abar) of the training schedule
  std::vector<float> timesteps_;
  std::vector<float> sigmas_;
  // The multistep history: the last solver_order converted outputs (oldest
  // first; undefined until filled), the sample before the last predictor.
  std::vector<at::Tensor> model_outputs_;
  at::Tensor last_sample_;
  int64_t lower_order_nums_ = 0;
  int64_t this_order_ = 0;
  int64_t next_step_ = 0;
};

}  // namespace tprun::pipelines
