#include "pipelines/flow_match_scheduler.h"

#include <cmath>
#include <utility>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/scalar_tensor.h>
#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::pipelines {
namespace {

using nlohmann::json;

constexpr const char* kClassName = "FlowMatchEulerDiscreteScheduler";

// The scheduler config is part of the model folder: a bad value is a
// CheckpointError naming the file and the key.
[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {} {}", source, field, what), true);
}

// A finite number in [lo, hi]: the values the schedule's float32 arithmetic
// takes without overflowing (real configs: shifts near 1, sequence lengths
// of a few thousand).
double bounded(const std::string& source, const char* field, double x, double lo, double hi) {
  if (!(x >= lo && x <= hi)) fail(source, field, fmt::format("{} is outside [{}, {}]", x, lo, hi));
  return x;
}

const json* field(const json& config, const char* name) {
  auto it = config.find(name);
  return it == config.end() ? nullptr : &*it;
}

bool read_bool(const json& config, const std::string& source, const char* name, bool fallback) {
  const json* v = field(config, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) fail(source, name, fmt::format("must be true or false, not {}", v->dump()));
  return v->get<bool>();
}

double read_number(const json& config, const std::string& source, const char* name, double fallback) {
  const json* v = field(config, name);
  if (v == nullptr) return fallback;
  if (!v->is_number()) fail(source, name, fmt::format("must be a number, not {}", v->dump()));
  double d = v->get<double>();
  if (!std::isfinite(d)) fail(source, name, fmt::format("must be finite, not {}", v->dump()));
  return d;
}

int64_t read_int(const json& config, const std::string& source, const char* name, int64_t fallback) {
  const json* v = field(config, name);
  if (v == nullptr) return fallback;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  fail(source, name, fmt::format("must be an integer, not {}", v->dump()));
}

}  // namespace

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json(const json& config, const std::string& source) {
  if (!config.is_object()) {
    throw CheckpointError(fmt::format("{}: the scheduler config must be a JSON object", source), true);
  }
  if (const json* cls = field(config, "_class_name"); cls != nullptr) {
    if (!cls->is_string() || cls->get<std::string>() != kClassName)
      fail(source, "_class_name", fmt::format("is {}; tprun implements only {}", cls->dump(), kClassName));
  }
  FlowMatchSchedulerConfig c;
  c.num_train_timesteps = read_int(config, source, "num_train_timesteps", c.num_train_timesteps);
  if (c.num_train_timesteps < 1)
    fail(source, "num_train_timesteps", fmt::format("must be at least 1, not {}", c.num_train_timesteps));
  c.shift = read_number(config, source, "shift", c.shift);
  if (c.shift <= 0.0) fail(source, "shift", fmt::format("must be positive, not {}", c.shift));
  bounded(source, "shift", c.shift, 0.0, 1000.0);
  c.use_dynamic_shifting = read_bool(config, source, "use_dynamic_shifting", c.use_dynamic_shifting);
  // FluxPipeline feeds these to calculate_shift on every call, so null is no
  // more usable here than in diffusers (where it fails in the arithmetic).
  c.base_shift = bounded(source, "base_shift", read_number(config, source, "base_shift", c.base_shift), -10.0, 10.0);
  c.max_shift = bounded(source, "max_shift", read_number(config, source, "max_shift", c.max_shift), -10.0, 10.0);
  c.base_image_seq_len = read_int(config, source, "base_image_seq_len", c.base_image_seq_len);
  c.max_image_seq_len = read_int(config, source, "max_image_seq_len", c.max_image_seq_len);
  bounded(source, "base_image_seq_len", static_cast<double>(c.base_image_seq_len), 0, 1 << 24);
  bounded(source, "max_image_seq_len", static_cast<double>(c.max_image_seq_len), 0, 1 << 24);
  if (c.max_image_seq_len == c.base_image_seq_len)
    fail(source, "max_image_seq_len",
         fmt::format("{} equals base_image_seq_len; calculate_shift divides by their difference",
                     c.max_image_seq_len));
  c.invert_sigmas = read_bool(config, source, "invert_sigmas", c.invert_sigmas);
  if (const json* v = field(config, "shift_terminal"); v != nullptr && !v->is_null()) {
    double t = read_number(config, source, "shift_terminal", 0.0);
    if (t < 0.0 || t >= 1.0) fail(source, "shift_terminal", fmt::format("must be in [0, 1) or null, not {}", t));
    if (t != 0.0) c.shift_terminal = t;  // diffusers tests it for truth: 0 means no stretch
  }
  if (const json* v = field(config, "time_shift_type"); v != nullptr) {
    if (!v->is_string() || (v->get<std::string>() != "exponential" && v->get<std::string>() != "linear"))
      fail(source, "time_shift_type", fmt::format("must be \"exponential\" or \"linear\", not {}", v->dump()));
    c.time_shift_type = v->get<std::string>();
  }
  for (const char* name : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"}) {
    if (read_bool(config, source, name, false))
      fail(source, name, "is true; tprun's FlowMatchEulerDiscreteScheduler does not implement it (set it to false)");
  }
  return c;
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_file(const std::string& path) {
  return from_json(read_json_file(path, "scheduler config"), path);
}

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len, double base_shift,
                       double max_shift) {
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - m * static_cast<double>(base_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(FlowMatchSchedulerConfig config)
    : config_(std::move(config)) {}

StepLimit FlowMatchEulerDiscreteScheduler::step_limit() const {
  if (!config_.shift_terminal) return {};
  return {2, fmt::format("shift_terminal {} stretches the schedule by 1 - its last sigma, which is 0 for a single step",
                         *config_.shift_terminal)};
}

double FlowMatchEulerDiscreteScheduler::mu_for(int64_t image_seq_len) const {
  return calculate_shift(image_seq_len, config_.base_image_seq_len, config_.max_image_seq_len, config_.base_shift,
                         config_.max_shift);
}

void FlowMatchEulerDiscreteScheduler::set_timesteps(int64_t num_inference_steps, std::optional<double> mu) {
  if (num_inference_steps < 1)
    throw RequestError(fmt::format("num_inference_steps {} must be at least 1", num_inference_steps));
  // numpy's linspace(1.0, 1/n, n) in float64: start + i * step, the last value exactly `stop`.
  const int64_t n = num_inference_steps;
  const double start = 1.0, stop = 1.0 / static_cast<double>(n);
  std::vector<double> sigmas(static_cast<size_t>(n));
  const double step = n > 1 ? (stop - start) / static_cast<double>(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i) sigmas[static_cast<size_t>(i)] = static_cast<double>(i) * step + start;
  if (n > 1) sigmas.back() = stop;
  set_sigmas(sigmas, mu);
}

void FlowMatchEulerDiscreteScheduler::set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu) {
  if (sigmas.empty()) throw RequestError("sigmas: the schedule needs at least one sigma");
  std::vector<float> s(sigmas.size());
  for (size_t i = 0; i < sigmas.size(); ++i) s[i] = static_cast<float>(sigmas[i]);
  finish(std::move(s), mu);
}

void FlowMatchEulerDiscreteScheduler::finish(std::vector<float> s, std::optional<double> mu) {
  // Every operation below is float32 arithmetic with the Python scalars
  // rounded to float32 first, which is what numpy does with a float32 array.
  if (config_.use_dynamic_shifting) {
    if (!mu.has_value())
      throw ConfigError("scheduler use_dynamic_shifting is true, so set_timesteps needs mu (calculate_shift)");
    const bool exponential = config_.time_shift_type == "exponential";
    const float a = exponential ? static_cast<float>(std::exp(*mu)) : static_cast<float>(*mu);
    for (float& x : s) x = a / (a + (1.0f / x - 1.0f));
  } else {
    const float shift = static_cast<float>(config_.shift);
    const float shift_m1 = static_cast<float>(config_.shift - 1.0);
    for (float& x : s) x = shift * x / (1.0f + shift_m1 * x);
  }
  for (float x : s) {
    if (!std::isfinite(x)) {
      throw RequestError(fmt::format("the schedule of {} steps is not finite (shift mu {}): the scheduler config's "
                                     "shifts do not fit this image size",
                                     s.size(), mu ? fmt::format("{}", *mu) : std::string("unset")),
                         true);
    }
  }
  if (config_.shift_terminal.has_value()) {
    if (s.back() >= 1.0f) {
      throw RequestError(fmt::format("steps: the scheduler's shift_terminal {} stretches the schedule by 1 - its "
                                     "last sigma, which is 0 here ({} step(s)); use more steps",
                                     *config_.shift_terminal, s.size()),
                         true);
    }
    const float scale = (1.0f - s.back()) / static_cast<float>(1.0 - *config_.shift_terminal);
    for (float& x : s) x = 1.0f - (1.0f - x) / scale;
  }
  store(std::move(s));
}

void FlowMatchEulerDiscreteScheduler::set_own_timesteps(int64_t num_inference_steps, std::optional<double> mu) {
  if (num_inference_steps < 1)
    throw RequestError(fmt::format("num_inference_steps {} must be at least 1", num_inference_steps));
  if (config_.use_dynamic_shifting && !mu.has_value())
    throw ConfigError("scheduler use_dynamic_shifting is true, so set_timesteps needs mu (calculate_shift)");
  // __init__'s training sigmas (float32 torch): t / T for t = T .. 1, shifted
  // unless dynamic; their ends are sigma_max and sigma_min.
  const int64_t train = config_.num_train_timesteps;
  const float train_f = static_cast<float>(train);
  auto train_sigma = [&](float t) {
    const float x = t / train_f;
    if (config_.use_dynamic_shifting) return x;
    return static_cast<float>(config_.shift) * x / (1.0f + static_cast<float>(config_.shift - 1.0) * x);
  };
  const double t_max = static_cast<double>(train_sigma(train_f)) * static_cast<double>(train);
  const double t_min = static_cast<double>(train_sigma(1.0f)) * static_cast<double>(train);
  std::vector<double> sigmas = numpy_linspace(t_max, t_min, num_inference_steps);
  for (double& x : sigmas) {
    x /= static_cast<double>(train);
    if (config_.use_dynamic_shifting) {
      const double a = config_.time_shift_type == "exponential" ? std::exp(*mu) : *mu;
      x = a / (a + (1.0 / x - 1.0));
    } else {
      x = config_.shift * x / (1.0 + (config_.shift - 1.0) * x);
    }
  }
  if (config_.shift_terminal.has_value()) {
    if (sigmas.back() >= 1.0) {
      throw RequestError(fmt::format("steps: the scheduler's shift_terminal {} stretches the schedule by 1 - its "
                                     "last sigma, which is 0 here ({} step(s)); use more steps",
                                     *config_.shift_terminal, sigmas.size()),
                         true);
    }
    const double scale = (1.0 - sigmas.back()) / (1.0 - *config_.shift_terminal);
    for (double& x : sigmas) x = 1.0 - (1.0 - x) / scale;
  }
  std::vector<float> s(sigmas.begin(), sigmas.end());
  for (float x : s) {
    if (!std::isfinite(x)) {
      throw RequestError(fmt::format("the schedule of {} steps is not finite (shift mu {}): the scheduler config's "
                                     "shifts do not fit this request",
                                     s.size(), mu ? fmt::format("{}", *mu) : std::string("unset")),
                         true);
    }
  }
  store(std::move(s));
}

void FlowMatchEulerDiscreteScheduler::store(std::vector<float> s) {
  float terminal = 0.0f;
  if (config_.invert_sigmas) {
    for (float& x : s) x = 1.0f - x;
    terminal = 1.0f;
  }
  const float train = static_cast<float>(config_.num_train_timesteps);
  timesteps_.assign(s.size(), 0.0f);
  for (size_t i = 0; i < s.size(); ++i) timesteps_[i] = s[i] * train;
  s.push_back(terminal);
  sigmas_ = std::move(s);
}

at::Tensor FlowMatchEulerDiscreteScheduler::timesteps_tensor() const {
  auto copy = timesteps_;
  return at::from_blob(copy.data(), {static_cast<int64_t>(copy.size())}, at::TensorOptions().dtype(at::kFloat))
      .clone();
}

at::Tensor FlowMatchEulerDiscreteScheduler::sigmas_tensor() const {
  auto copy = sigmas_;
  return at::from_blob(copy.data(), {static_cast<int64_t>(copy.size())}, at::TensorOptions().dtype(at::kFloat))
      .clone();
}

at::Tensor FlowMatchEulerDiscreteScheduler::step(const at::Tensor& model_output, int64_t step_index,
                                                 const at::Tensor& sample) const {
  const int64_t n = num_inference_steps();
  if (step_index < 0 || step_index >= n)
    throw Error(Error::Kind::Internal,
                fmt::format("scheduler step index {} is outside the schedule of {} steps{}", step_index, n,
                            n == 0 ? " (set_timesteps was not called)" : ""));
  const auto i = static_cast<size_t>(step_index);
  const float dt = sigmas_[i + 1] - sigmas_[i];
  const at::Tensor dt_t = at::scalar_tensor(dt, at::TensorOptions().dtype(at::kFloat).device(sample.device()));
  at::Tensor prev = sample.to(at::kFloat) + dt_t * model_output;
  return prev.to(model_output.scalar_type());
}

}  // namespace tprun::pipelines
