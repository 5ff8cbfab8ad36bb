#include "pipelines/unipc_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/cumprod.h>
#include <ATen/ops/einsum.h>
#include <ATen/ops/expm1.h>
#include <ATen/ops/linalg_solve.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/log.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/quantile.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

constexpr int64_t kMaxSteps = 1000000;
const at::TensorOptions kF32 = at::TensorOptions().dtype(at::kFloat);

// diffusers' betas_for_alpha_bar(T) ("cosine", max_beta 0.999), in Python floats.
std::vector<double> squaredcos_cap_v2_betas(int64_t n) {
  auto alpha_bar = [](double t) {
    const double c = std::cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
  };
  std::vector<double> betas;
  for (int64_t i = 0; i < n; ++i) {
    const double t1 = static_cast<double>(i) / static_cast<double>(n);
    const double t2 = static_cast<double>(i + 1) / static_cast<double>(n);
    betas.push_back(std::min(1 - alpha_bar(t2) / alpha_bar(t1), 0.999));
  }
  return betas;
}

at::Tensor f32_tensor(const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  return at::tensor(f, kF32);
}

// diffusers' rescale_zero_terminal_snr, the same torch operations in the same order.
at::Tensor rescale_zero_terminal_snr(const at::Tensor& betas) {
  at::Tensor alphas_bar_sqrt = at::cumprod(1.0 - betas, 0).sqrt();
  const at::Tensor first = alphas_bar_sqrt[0].clone();
  const at::Tensor last = alphas_bar_sqrt[-1].clone();
  alphas_bar_sqrt -= last;
  alphas_bar_sqrt *= first / (first - last);
  const at::Tensor alphas_bar = at::pow(alphas_bar_sqrt, 2);
  const at::Tensor alphas =
      at::cat({alphas_bar.slice(0, 0, 1), alphas_bar.slice(0, 1) / alphas_bar.slice(0, 0, -1)});
  return 1 - alphas;
}

// The training schedule's sigmas sqrt((1 - abar) / abar), float32, as diffusers' __init__ makes them.
at::Tensor train_sigmas(const UniPCSchedulerConfig& c) {
  const int64_t n = c.num_train_timesteps;
  at::Tensor betas;
  if (!c.trained_betas.empty()) {
    betas = f32_tensor(c.trained_betas);
  } else if (c.beta_schedule == "linear") {
    betas = at::linspace(c.beta_start, c.beta_end, n, kF32);
  } else if (c.beta_schedule == "scaled_linear") {
    betas = at::pow(at::linspace(std::pow(c.beta_start, 0.5), std::pow(c.beta_end, 0.5), n, kF32), 2);
  } else {
    betas = f32_tensor(squaredcos_cap_v2_betas(n));
  }
  if (c.rescale_betas_zero_snr) betas = rescale_zero_terminal_snr(betas);
  at::Tensor alphas_cumprod = at::cumprod(1.0 - betas, 0);
  if (c.rescale_betas_zero_snr) alphas_cumprod[-1].fill_(std::ldexp(1.0, -24));
  return at::pow((1 - alphas_cumprod) / alphas_cumprod, 0.5);
}

// The integer timesteps of timestep_spacing for `n` steps (diffusers' set_timesteps; numpy rounds half to even).
std::vector<int64_t> spaced_timesteps(const UniPCSchedulerConfig& c, int64_t n) {
  const int64_t train = c.num_train_timesteps;
  std::vector<int64_t> t;
  if (c.timestep_spacing == "linspace") {
    const auto y = numpy_linspace(0.0, static_cast<double>(train - 1), n + 1);
    for (int64_t i = n; i >= 1; --i) t.push_back(static_cast<int64_t>(std::nearbyint(y[static_cast<size_t>(i)])));
  } else if (c.timestep_spacing == "leading") {
    const int64_t ratio = train / (n + 1);
    for (int64_t i = n; i >= 1; --i) t.push_back(i * ratio + c.steps_offset);
  } else {  // trailing: numpy's arange(T, 0, -T / n), its length ceil(T / (T / n)) (n, or n + 1 by rounding)
    const double step = -static_cast<double>(train) / static_cast<double>(n);
    const double start = static_cast<double>(train);
    const auto len = static_cast<int64_t>(std::ceil((0.0 - start) / step));
    const double delta = (start + step) - start;  // numpy fills start + i * (a[1] - a[0])
    for (int64_t i = 0; i < len; ++i) {
      const double v = i == 0 ? start : i == 1 ? start + step : start + static_cast<double>(i) * delta;
      t.push_back(static_cast<int64_t>(std::nearbyint(v)) - 1);
    }
  }
  return t;
}

[[noreturn]] void non_finite(int64_t steps, std::optional<double> mu) {
  throw RequestError(fmt::format("the UniPC schedule of {} steps is not finite (mu {}): the scheduler config's "
                                 "shifts do not fit this request",
                                 steps, mu ? fmt::format("{}", *mu) : std::string("unset")),
                     true);
}

at::Tensor scalar(float x) { return at::scalar_tensor(x, kF32); }

}  // namespace

UniPCMultistepScheduler::UniPCMultistepScheduler(UniPCSchedulerConfig config) : config_(std::move(config)) {
  if (!config_.use_flow_sigmas) train_sigmas_ = train_sigmas(config_);
}

StepLimit UniPCMultistepScheduler::step_limit() const {
  if (!config_.shift_terminal) return {};
  return {2, fmt::format("shift_terminal {} stretches the schedule by 1 - its last sigma, which is 0 for a single step",
                         *config_.shift_terminal)};
}

void UniPCMultistepScheduler::set_timesteps(int64_t steps, std::optional<double> mu) {
  timesteps_.clear();  // a refused schedule leaves none: step() refuses until the next set_timesteps
  sigmas_.clear();
  next_step_ = 0;
  if (steps < 1 || steps > kMaxSteps)
    throw RequestError(fmt::format("steps {} is outside [1, {}]", steps, kMaxSteps));
  if (config_.use_dynamic_shifting && !mu.has_value())
    throw ConfigError("scheduler use_dynamic_shifting is true, so set_timesteps needs mu");
  const double train = static_cast<double>(config_.num_train_timesteps);
  std::vector<double> sigmas;  // float64, as numpy holds them
  std::vector<int64_t> timesteps;
  double last = 0.0;
  if (config_.use_flow_sigmas) {
    sigmas = numpy_linspace(1.0, 1.0 / train, steps + 1);
    sigmas.pop_back();
    for (double& s : sigmas) {
      if (config_.use_dynamic_shifting) {
        const double a = config_.time_shift_type == "exponential" ? std::exp(*mu) : *mu;
        s = a / (a + (1.0 / s - 1.0));
      } else {
        s = config_.flow_shift * s / (1.0 + (config_.flow_shift - 1.0) * s);
      }
    }
    if (config_.shift_terminal) {
      const double scale = (1.0 - sigmas.back()) / (1.0 - *config_.shift_terminal);
      for (double& s : sigmas) s = 1.0 - (1.0 - s) / scale;
    }
    if (std::fabs(sigmas[0] - 1.0) < 1e-6) sigmas[0] -= 1e-6;
    for (double s : sigmas) {
      const double t = s * train;
      if (!std::isfinite(t) || std::fabs(t) > 1e15) non_finite(steps, mu);
      timesteps.push_back(static_cast<int64_t>(t));  // torch's .to(int64): toward zero
    }
    if (config_.final_sigmas_type == "sigma_min") last = sigmas.back();
  } else {
    timesteps = spaced_timesteps(config_, steps);
    const auto* table = train_sigmas_.data_ptr<float>();
    const int64_t top = train_sigmas_.size(0) - 1;
    for (int64_t t : timesteps) sigmas.push_back(table[std::clamp<int64_t>(t, 0, top)]);  // np.interp at integers
    if (config_.final_sigmas_type == "sigma_min") last = table[0];
  }
  sigmas.push_back(last);
  for (double s : sigmas)
    if (!std::isfinite(static_cast<float>(s))) non_finite(steps, mu);
  sigmas_.assign(sigmas.begin(), sigmas.end());
  timesteps_.assign(timesteps.begin(), timesteps.end());
  model_outputs_.assign(static_cast<size_t>(config_.solver_order), at::Tensor());
  last_sample_ = at::Tensor();
  lower_order_nums_ = 0;
  this_order_ = 0;
  next_step_ = 0;
}

namespace {

// (alpha_t, sigma_t) of a sigma, as diffusers' _sigma_to_alpha_sigma_t on a float32 0-d tensor.
std::pair<at::Tensor, at::Tensor> alpha_sigma(float sigma, bool flow) {
  const at::Tensor s = scalar(sigma);
  if (flow) return {1 - s, s};
  const at::Tensor alpha = at::reciprocal(at::pow(at::pow(s, 2) + 1, 0.5)) * 1;
  return {alpha, s * alpha};
}

at::Tensor lambda_of(float sigma, bool flow) {
  auto [alpha, s] = alpha_sigma(sigma, flow);
  return at::log(alpha) - at::log(s);
}

// The coefficients UniP and UniC share, from h (the log-SNR step) and the
// ratios rks (ending with 1): R (order x order), b (order), h_phi_1, B(h).
struct UniCoefficients {
  at::Tensor R, b, h_phi_1, B_h;
};

UniCoefficients coefficients(const at::Tensor& h, const std::vector<at::Tensor>& rk_list, int64_t order,
                             bool predict_x0, bool bh1) {
  std::vector<at::Tensor> rk = rk_list;
  rk.push_back(at::ones({}, kF32));
  const at::Tensor rks = at::stack(rk);
  const at::Tensor hh = predict_x0 ? -h : h;
  UniCoefficients c;
  c.h_phi_1 = at::expm1(hh);
  at::Tensor h_phi_k = c.h_phi_1 / hh - 1;
  int64_t factorial = 1;
  c.B_h = bh1 ? hh : at::expm1(hh);
  std::vector<at::Tensor> R, b;
  for (int64_t i = 1; i <= order; ++i) {
    R.push_back(at::pow(rks, i - 1));
    b.push_back(h_phi_k * factorial / c.B_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
  }
  c.R = at::stack(R);
  c.b = at::stack(b);
  return c;
}

// sum_k rhos[k] D1s[k] as diffusers' einsum("k,bkc...->bc...").
at::Tensor weighted(const at::Tensor& rhos, const std::vector<at::Tensor>& d1s, const at::Tensor& like) {
  return at::einsum("k,bkc...->bc...", {rhos.to(like.device()), at::stack(d1s, 1)});
}

}  // namespace

at::Tensor UniPCMultistepScheduler::threshold_sample(const at::Tensor& sample) const {
  const auto dtype = sample.scalar_type();
  at::Tensor x = (dtype == at::kFloat || dtype == at::kDouble) ? sample : sample.to(at::kFloat);
  x = x.reshape({sample.size(0), -1});
  at::Tensor s = at::quantile(x.abs(), config_.dynamic_thresholding_ratio, 1);
  s = at::clamp(s, at::Scalar(1), at::Scalar(config_.sample_max_value)).unsqueeze(1);
  x = at::clamp(x, -s, s) / s;
  return x.reshape(sample.sizes()).to(dtype);
}

at::Tensor UniPCMultistepScheduler::convert_model_output(const at::Tensor& model_output, const at::Tensor& sample,
                                                         size_t i) const {
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[i], config_.use_flow_sigmas);
  const std::string& type = config_.prediction_type;
  if (config_.predict_x0) {
    at::Tensor x0;
    if (type == "epsilon") {
      x0 = (sample - sigma_t * model_output) / alpha_t;
    } else if (type == "sample") {
      x0 = model_output;
    } else if (type == "v_prediction") {
      x0 = alpha_t * sample - sigma_t * model_output;
    } else {  // flow_prediction: the raw sigma
      x0 = sample - scalar(sigmas_[i]) * model_output;
    }
    return config_.thresholding ? threshold_sample(x0) : x0;
  }
  if (type == "epsilon") return model_output;
  if (type == "sample") return (sample - alpha_t * model_output) / sigma_t;
  return alpha_t * model_output + sigma_t * sample;  // v_prediction (flow_prediction is refused at load)
}

// UniP: the next sample from `x` at sigmas_[i] to sigmas_[i + 1] (diffusers' multistep_uni_p_bh_update).
at::Tensor UniPCMultistepScheduler::predict(const at::Tensor& x, int64_t order, size_t i) const {
  const bool flow = config_.use_flow_sigmas;
  const at::Tensor& m0 = model_outputs_.back();
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[i + 1], flow);
  const auto [alpha_s0, sigma_s0] = alpha_sigma(sigmas_[i], flow);
  const at::Tensor lambda_s0 = at::log(alpha_s0) - at::log(sigma_s0);
  const at::Tensor h = (at::log(alpha_t) - at::log(sigma_t)) - lambda_s0;
  std::vector<at::Tensor> rks, d1s;
  for (int64_t k = 1; k < order; ++k) {
    const at::Tensor rk = (lambda_of(sigmas_[i - static_cast<size_t>(k)], flow) - lambda_s0) / h;
    rks.push_back(rk);
    d1s.push_back((model_outputs_[model_outputs_.size() - 1 - static_cast<size_t>(k)] - m0) / rk);
  }
  const UniCoefficients c = coefficients(h, rks, order, config_.predict_x0, config_.solver_type == "bh1");
  at::Tensor res;  // diffusers' pred_res; undefined: 0
  if (!d1s.empty()) {
    const at::Tensor rhos =
        order == 2 ? at::ones({1}, kF32.dtype(x.scalar_type())) * 0.5
                   : at::linalg_solve(c.R.slice(0, 0, -1).slice(1, 0, -1), c.b.slice(0, 0, -1))
                         .to(x.scalar_type());
    res = weighted(rhos, d1s, x);
  }
  at::Tensor x_t;
  if (config_.predict_x0) {
    x_t = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0;
    x_t = res.defined() ? x_t - alpha_t * c.B_h * res : x_t - alpha_t * c.B_h * 0;
  } else {
    x_t = alpha_t / alpha_s0 * x - sigma_t * c.h_phi_1 * m0;
    x_t = res.defined() ? x_t - sigma_t * c.B_h * res : x_t - sigma_t * c.B_h * 0;
  }
  return x_t.to(x.scalar_type());
}

// UniC: the sample at sigmas_[i], predicted from `x` (the last sample, at
// sigmas_[i - 1]) with the previous order, corrected with this step's
// converted output `model_t` (diffusers' multistep_uni_c_bh_update; the
// predicted sample itself enters only through model_t).
at::Tensor UniPCMultistepScheduler::correct(const at::Tensor& model_t, const at::Tensor& x, int64_t order,
                                            size_t i) const {
  const bool flow = config_.use_flow_sigmas;
  const at::Tensor& m0 = model_outputs_.back();
  const auto [alpha_t, sigma_t] = alpha_sigma(sigmas_[i], flow);
  const auto [alpha_s0, sigma_s0] = alpha_sigma(sigmas_[i - 1], flow);
  const at::Tensor lambda_s0 = at::log(alpha_s0) - at::log(sigma_s0);
  const at::Tensor h = (at::log(alpha_t) - at::log(sigma_t)) - lambda_s0;
  std::vector<at::Tensor> rks, d1s;
  for (int64_t k = 1; k < order; ++k) {
    const at::Tensor rk = (lambda_of(sigmas_[i - 1 - static_cast<size_t>(k)], flow) - lambda_s0) / h;
    rks.push_back(rk);
    d1s.push_back((model_outputs_[model_outputs_.size() - 1 - static_cast<size_t>(k)] - m0) / rk);
  }
  const UniCoefficients c = coefficients(h, rks, order, config_.predict_x0, config_.solver_type == "bh1");
  const at::Tensor rhos = order == 1 ? at::ones({1}, kF32.dtype(x.scalar_type())) * 0.5
                                     : at::linalg_solve(c.R, c.b).to(x.scalar_type());
  const at::Tensor d1_t = model_t - m0;
  const at::Tensor last_rho = rhos[-1].to(x.device());
  const at::Tensor corr = d1s.empty() ? last_rho * d1_t : weighted(rhos.slice(0, 0, -1), d1s, x) + last_rho * d1_t;
  at::Tensor out;
  if (config_.predict_x0) {
    out = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0 - alpha_t * c.B_h * corr;
  } else {
    out = alpha_t / alpha_s0 * x - sigma_t * c.h_phi_1 * m0 - sigma_t * c.B_h * corr;
  }
  return out.to(x.scalar_type());
}

at::Tensor UniPCMultistepScheduler::step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample) {
  const auto n = static_cast<int64_t>(timesteps_.size());
  if (n == 0 || step_index != next_step_ || step_index >= n)
    throw Error(Error::Kind::Internal,
                fmt::format("UniPC step {} called out of order: the next step is {} of a schedule of {}{}", step_index,
                            next_step_, n, n == 0 ? " (set_timesteps was not called)" : ""));
  if (sample.dim() < 2 || !sample.sizes().equals(model_output.sizes()))
    throw Error(Error::Kind::Internal, "UniPC steps samples [B, C, ...] and model outputs of the same shape");
  const auto i = static_cast<size_t>(step_index);
  const bool use_corrector =
      step_index > 0 && last_sample_.defined() &&
      std::find(config_.disable_corrector.begin(), config_.disable_corrector.end(), step_index - 1) ==
          config_.disable_corrector.end();
  const at::Tensor converted = convert_model_output(model_output, sample, i);
  at::Tensor x = use_corrector ? correct(converted, last_sample_, this_order_, i) : sample;
  std::rotate(model_outputs_.begin(), model_outputs_.begin() + 1, model_outputs_.end());
  model_outputs_.back() = converted;
  int64_t order = config_.solver_order;
  if (config_.lower_order_final) order = std::min(order, n - step_index);
  this_order_ = std::min(order, lower_order_nums_ + 1);  // the warm-up: one order more per step taken
  last_sample_ = x;
  at::Tensor prev = predict(x, this_order_, i);
  if (lower_order_nums_ < config_.solver_order) ++lower_order_nums_;
  ++next_step_;
  return prev;
}

}  // namespace tprun::pipelines
