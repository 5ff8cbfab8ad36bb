// UniPCSchedulerConfig::from_json: scheduler_config.json's keys as diffusers
// writes them, each bounded (unipc_scheduler.h lists what is refused).

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/model_config.h"
#include "pipelines/unipc_scheduler.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::pipelines {
namespace {

using nlohmann::json;

constexpr int64_t kMaxTrainTimesteps = 100000;
constexpr int64_t kMaxSolverOrder = 4;
constexpr size_t kMaxDisabledSteps = 10000;

// A bad value in the folder's scheduler config: a CheckpointError naming the file and the key.
[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {} {}", source, field, what), true);
}

double number_in(const json& c, const std::string& source, const char* field, double fallback, double lo, double hi,
                 bool open_hi = false) {
  const double x = models::config_number_or(c, field, source, fallback);
  if (!(x >= lo && (open_hi ? x < hi : x <= hi)))
    fail(source, field, fmt::format("is {}, outside [{}, {}{}", x, lo, hi, open_hi ? ")" : "]"));
  return x;
}

int64_t int_in(const json& c, const std::string& source, const char* field, int64_t fallback, int64_t lo, int64_t hi) {
  const int64_t x = models::config_int_or_null(c, field, source).value_or(fallback);
  if (x < lo || x > hi) fail(source, field, fmt::format("is {}, outside [{}, {}]", x, lo, hi));
  return x;
}

std::string one_of(const json& c, const std::string& source, const char* field, const std::string& fallback,
                   const std::vector<std::string>& allowed) {
  const std::string v = models::config_string_or(c, field, source, fallback);
  for (const auto& a : allowed)
    if (v == a) return v;
  fail(source, field,
       fmt::format("is '{}'; UniPCMultistepScheduler takes \"{}\"", clip_text(v), fmt::join(allowed, "\", \"")));
}

std::vector<double> trained_betas(const json& c, const std::string& source, int64_t num_train_timesteps) {
  auto it = c.find("trained_betas");
  if (it == c.end() || it->is_null()) return {};
  if (!it->is_array() || it->size() != static_cast<size_t>(num_train_timesteps))
    fail(source, "trained_betas",
         fmt::format("must be a list of num_train_timesteps ({}) numbers or null", num_train_timesteps));
  std::vector<double> betas;
  for (const json& b : *it) {
    if (!b.is_number() || !(b.get<double>() >= 0.0 && b.get<double>() < 1.0))
      fail(source, "trained_betas", fmt::format("holds {}; each beta must be a number in [0, 1)", clip_text(b.dump())));
    betas.push_back(b.get<double>());
  }
  return betas;
}

std::vector<int64_t> disabled_steps(const json& c, const std::string& source) {
  auto it = c.find("disable_corrector");
  if (it == c.end() || it->is_null()) return {};
  if (!it->is_array() || it->size() > kMaxDisabledSteps)
    fail(source, "disable_corrector", fmt::format("must be a list of at most {} step indices", kMaxDisabledSteps));
  std::vector<int64_t> steps;
  for (const json& s : *it) {
    if (!s.is_number_integer())
      fail(source, "disable_corrector", fmt::format("holds {}; step indices are integers", clip_text(s.dump())));
    steps.push_back(s.get<int64_t>());
  }
  return steps;
}

// Features diffusers has and tprun does not: refused by name where set.
void refuse_unimplemented(const json& c, const std::string& source) {
  for (const char* name : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"}) {
    if (models::config_bool_or(c, name, source, false))
      fail(source, name, "is true; tprun's UniPCMultistepScheduler does not implement it (set it to false)");
  }
  if (auto it = c.find("solver_p"); it != c.end() && !it->is_null())
    fail(source, "solver_p", "is set; tprun's UniPCMultistepScheduler implements UniPC's own predictor only (null)");
}

// Configs whose last step diffusers itself computes as NaN / inf (unipc_parity.py
// checks each against diffusers): a terminal sigma 0 makes the last log-SNR
// step h infinite; "sigma_min" on flow sigmas repeats the last sigma, h = 0.
void refuse_non_finite(const UniPCSchedulerConfig& c, const std::string& source) {
  if (c.final_sigmas_type == "zero") {
    if (c.solver_type == "bh1")
      fail(source, "solver_type",
           "is \"bh1\" with final_sigmas_type \"zero\": the last step multiplies B(h) = -inf by 0 and comes out "
           "NaN (in diffusers too); use \"bh2\" or final_sigmas_type \"sigma_min\"");
    if (!c.predict_x0)
      fail(source, "predict_x0",
           "is false with final_sigmas_type \"zero\": the last step multiplies sigma 0 by e^h - 1 = inf and comes "
           "out NaN (in diffusers too); use predict_x0 true or final_sigmas_type \"sigma_min\"");
    if (!c.lower_order_final && c.solver_order > 1)
      fail(source, "lower_order_final",
           fmt::format("is false with solver_order {} and final_sigmas_type \"zero\": the last step's higher-order "
                       "terms divide by an infinite log-SNR step and come out non-finite (in diffusers too); set it "
                       "true",
                       c.solver_order));
  } else if (c.use_flow_sigmas && !c.lower_order_final && c.solver_order > 2) {
    fail(source, "lower_order_final",
         fmt::format("is false with solver_order {}, use_flow_sigmas and final_sigmas_type \"sigma_min\": the last "
                     "step (h = 0) solves a singular system and comes out NaN (in diffusers too); set it true",
                     c.solver_order));
  }
}

UniPCSchedulerConfig read_config(const json& config, const std::string& source);

}  // namespace

// Every rank reads the same file: its errors are every rank's.
UniPCSchedulerConfig UniPCSchedulerConfig::from_json(const json& config, const std::string& source) {
  try {
    return read_config(config, source);
  } catch (const Error& e) {
    rethrow_on_all_ranks(e);
  }
}

namespace {

UniPCSchedulerConfig read_config(const json& config, const std::string& source) {
  if (!config.is_object())
    throw CheckpointError(fmt::format("{}: the scheduler config must be a JSON object", source), true);
  if (auto cls = config.find("_class_name"); cls != config.end()) {
    if (!cls->is_string() || cls->get<std::string>() != "UniPCMultistepScheduler")
      fail(source, "_class_name", fmt::format("is {}, not \"UniPCMultistepScheduler\"", clip_text(cls->dump())));
  }
  refuse_unimplemented(config, source);
  UniPCSchedulerConfig c;
  c.num_train_timesteps = int_in(config, source, "num_train_timesteps", c.num_train_timesteps, 1, kMaxTrainTimesteps);
  c.beta_start = number_in(config, source, "beta_start", c.beta_start, 0.0, 1.0, true);
  c.beta_end = number_in(config, source, "beta_end", c.beta_end, 0.0, 1.0, true);
  c.beta_schedule =
      one_of(config, source, "beta_schedule", c.beta_schedule, {"linear", "scaled_linear", "squaredcos_cap_v2"});
  c.trained_betas = trained_betas(config, source, c.num_train_timesteps);
  c.solver_order = int_in(config, source, "solver_order", c.solver_order, 1, kMaxSolverOrder);
  c.prediction_type = one_of(config, source, "prediction_type", c.prediction_type,
                             {"epsilon", "sample", "v_prediction", "flow_prediction"});
  c.thresholding = models::config_bool_or(config, "thresholding", source, c.thresholding);
  c.dynamic_thresholding_ratio =
      number_in(config, source, "dynamic_thresholding_ratio", c.dynamic_thresholding_ratio, 0.0, 1.0);
  c.sample_max_value = number_in(config, source, "sample_max_value", c.sample_max_value, 0.0, 1e9);
  if (c.sample_max_value <= 0.0) fail(source, "sample_max_value", "must be positive");
  c.predict_x0 = models::config_bool_or(config, "predict_x0", source, c.predict_x0);
  c.solver_type = one_of(config, source, "solver_type", c.solver_type, {"bh1", "bh2", "midpoint", "heun", "logrho"});
  if (c.solver_type != "bh1") c.solver_type = "bh2";  // as diffusers registers the three older names
  c.lower_order_final = models::config_bool_or(config, "lower_order_final", source, c.lower_order_final);
  c.disable_corrector = disabled_steps(config, source);
  c.use_flow_sigmas = models::config_bool_or(config, "use_flow_sigmas", source, c.use_flow_sigmas);
  c.flow_shift = number_in(config, source, "flow_shift", c.flow_shift, 0.0, 1000.0);
  if (c.flow_shift <= 0.0) fail(source, "flow_shift", fmt::format("must be positive, not {}", c.flow_shift));
  c.timestep_spacing =
      one_of(config, source, "timestep_spacing", c.timestep_spacing, {"linspace", "leading", "trailing"});
  c.steps_offset = int_in(config, source, "steps_offset", c.steps_offset, 0, c.num_train_timesteps);
  c.final_sigmas_type = one_of(config, source, "final_sigmas_type", c.final_sigmas_type, {"zero", "sigma_min"});
  c.rescale_betas_zero_snr = models::config_bool_or(config, "rescale_betas_zero_snr", source, c.rescale_betas_zero_snr);
  c.use_dynamic_shifting = models::config_bool_or(config, "use_dynamic_shifting", source, c.use_dynamic_shifting);
  c.time_shift_type = one_of(config, source, "time_shift_type", c.time_shift_type, {"exponential", "linear"});
  if (auto it = config.find("shift_terminal"); it != config.end() && !it->is_null()) {
    const double t = number_in(config, source, "shift_terminal", 0.0, 0.0, 1.0, true);
    if (!c.use_flow_sigmas) fail(source, "shift_terminal", "is set without use_flow_sigmas (diffusers refuses it too)");
    if (t != 0.0) c.shift_terminal = t;  // diffusers tests it for truth: 0 means no stretch
  }
  if (c.prediction_type == "flow_prediction" && !c.predict_x0)
    fail(source, "predict_x0", "is false; prediction_type \"flow_prediction\" needs the data prediction (true)");
  refuse_non_finite(c, source);
  return c;
}

}  // namespace

UniPCSchedulerConfig UniPCSchedulerConfig::from_file(const std::string& path) {
  return from_json(read_json_file(path, "scheduler config"), path);
}

}  // namespace tprun::pipelines
