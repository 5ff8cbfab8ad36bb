// FlowMatchEulerDiscreteScheduler against diffusers' reference
// (tests/data/flow_match_scheduler, copied from shared/ref) and hand cases.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/tensor_file.h"
#include "pipelines/flow_match_scheduler.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "test_data.h"

namespace tprun::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::source_dir;

fs::path case_dir() { return test::data_dir("flow_match_scheduler"); }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor to_tensor(const std::vector<float>& v) {
  auto t = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kFloat));
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return t;
}

FlowMatchSchedulerConfig flux_dev_config() {
  return FlowMatchSchedulerConfig::from_file((case_dir() / "scheduler_config.json").string());
}

// Expects a ConfigError whose message contains `needle`.
template <typename F>
void expect_config_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {  // CheckpointError for the config's values, ConfigError for a missing mu
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(FlowMatchScheduler, ReadsFluxDevConfig) {
  const auto c = flux_dev_config();
  EXPECT_EQ(c.num_train_timesteps, 1000);
  EXPECT_DOUBLE_EQ(c.shift, 3.0);
  EXPECT_TRUE(c.use_dynamic_shifting);
  EXPECT_DOUBLE_EQ(c.base_shift, 0.5);
  EXPECT_DOUBLE_EQ(c.max_shift, 1.15);
  EXPECT_EQ(c.base_image_seq_len, 256);
  EXPECT_EQ(c.max_image_seq_len, 4096);
  EXPECT_FALSE(c.invert_sigmas);
  EXPECT_FALSE(c.shift_terminal.has_value());
  EXPECT_EQ(c.time_shift_type, "exponential");
}

TEST(FlowMatchScheduler, TimestepsAndSigmasMatchDiffusers) {
  const json spec = read_json_file((case_dir() / "case.json").string(), "case");
  const double tol = spec.at("tolerance").at("max_abs_diff").get<double>();
  ASSERT_LE(tol, 1e-4);
  const auto expected = checkpoint::read_tensor_file((case_dir() / "expected.safetensors").string());
  FlowMatchEulerDiscreteScheduler sched(flux_dev_config());
  double worst_t = 0.0, worst_s = 0.0, worst_mu = 0.0;
  int cases = 0;
  for (int64_t seq : spec.at("grid").at("image_seq_len").get<std::vector<int64_t>>()) {
    const double mu = sched.mu_for(seq);
    const at::Tensor& mu_ref = expected.at(fmt::format("mu_seq{}", seq));
    ASSERT_EQ(mu_ref.scalar_type(), at::kDouble);
    worst_mu = std::max(worst_mu, std::fabs(mu - mu_ref.item<double>()));
    EXPECT_NEAR(mu, spec.at("mu").at(std::to_string(seq)).get<double>(), 1e-12);
    for (int64_t n : spec.at("grid").at("num_inference_steps").get<std::vector<int64_t>>()) {
      sched.set_timesteps(n, mu);
      ASSERT_EQ(sched.num_inference_steps(), n);
      ASSERT_EQ(sched.sigmas().size(), static_cast<size_t>(n + 1));
      EXPECT_EQ(sched.sigmas().back(), 0.0f);
      const at::Tensor& t_ref = expected.at(fmt::format("timesteps_n{}_seq{}", n, seq));
      const at::Tensor& s_ref = expected.at(fmt::format("sigmas_n{}_seq{}", n, seq));
      ASSERT_EQ(t_ref.numel(), n);
      ASSERT_EQ(s_ref.numel(), n + 1);
      const double dt = max_abs_diff(sched.timesteps_tensor(), t_ref);
      const double ds = max_abs_diff(sched.sigmas_tensor(), s_ref);
      EXPECT_LE(dt, tol) << "timesteps n=" << n << " seq=" << seq;
      EXPECT_LE(ds, tol) << "sigmas n=" << n << " seq=" << seq;
      worst_t = std::max(worst_t, dt);
      worst_s = std::max(worst_s, ds);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 12);
  EXPECT_LE(worst_mu, 1e-12);
  std::printf("[ scheduler ] %d schedules: max |dmu| %.3g, max |dtimesteps| %.3g, max |dsigmas| %.3g (tol %.0e)\n",
              cases, worst_mu, worst_t, worst_s, tol);
}

TEST(FlowMatchScheduler, EulerStepsMatchDiffusers) {
  const auto inputs = checkpoint::read_tensor_file((case_dir() / "inputs.safetensors").string());
  const auto expected = checkpoint::read_tensor_file((case_dir() / "expected.safetensors").string());
  FlowMatchEulerDiscreteScheduler sched(flux_dev_config());
  sched.set_timesteps(4, sched.mu_for(64));
  at::Tensor x = inputs.at("sample");
  double worst = 0.0;
  for (int64_t i = 0; i < 4; ++i) {
    x = sched.step(inputs.at(fmt::format("model_output_{}", i)), i, x);
    ASSERT_EQ(x.scalar_type(), at::kFloat);
    const double d = max_abs_diff(x, expected.at(fmt::format("prev_sample_{}", i)));
    EXPECT_LE(d, 1e-4) << "step " << i;
    worst = std::max(worst, d);
  }
  std::printf("[ scheduler ] 4 Euler steps: max |dprev_sample| %.3g\n", worst);
}

TEST(FlowMatchScheduler, MatchesFluxPipelineSchedule) {
  // The 3-step, 32x32 (64 tokens) schedule FluxPipeline recorded in its debug tensors.
  const auto debug =
      checkpoint::read_tensor_file((source_dir() / "tests" / "data" / "flux_pipeline" / "debug.safetensors").string());
  FlowMatchEulerDiscreteScheduler sched(flux_dev_config());
  sched.set_timesteps(3, sched.mu_for(64));
  EXPECT_LE(max_abs_diff(sched.timesteps_tensor(), debug.at("scheduler.timesteps")), 1e-4);
  EXPECT_LE(max_abs_diff(sched.sigmas_tensor(), debug.at("scheduler.sigmas")), 1e-4);
}

TEST(FlowMatchScheduler, StaticShiftHandComputed) {
  FlowMatchSchedulerConfig c;  // diffusers defaults, then FLUX.1-schnell-like static shift
  c.shift = 3.0;
  FlowMatchEulerDiscreteScheduler sched(c);
  sched.set_timesteps(2, std::nullopt);  // sigmas in: [1, 0.5]
  ASSERT_EQ(sched.sigmas().size(), 3u);
  EXPECT_FLOAT_EQ(sched.sigmas()[0], 1.0f);
  EXPECT_FLOAT_EQ(sched.sigmas()[1], 0.75f);  // 3 * 0.5 / (1 + 2 * 0.5)
  EXPECT_FLOAT_EQ(sched.sigmas()[2], 0.0f);
  EXPECT_FLOAT_EQ(sched.timesteps()[0], 1000.0f);
  EXPECT_FLOAT_EQ(sched.timesteps()[1], 750.0f);
}

TEST(FlowMatchScheduler, LinearShiftTerminalAndInvert) {
  FlowMatchSchedulerConfig c;
  c.use_dynamic_shifting = true;
  c.time_shift_type = "linear";
  FlowMatchEulerDiscreteScheduler lin(c);
  lin.set_timesteps(2, 2.0);  // 0.5 -> 2 / (2 + 1)
  EXPECT_FLOAT_EQ(lin.sigmas()[1], 2.0f / 3.0f);

  FlowMatchSchedulerConfig t;
  t.shift_terminal = 0.1;
  FlowMatchEulerDiscreteScheduler term(t);
  term.set_timesteps(4, std::nullopt);
  EXPECT_NEAR(term.sigmas()[3], 0.1f, 1e-6);  // stretched to end at shift_terminal
  EXPECT_FLOAT_EQ(term.sigmas()[0], 1.0f);
  EXPECT_FLOAT_EQ(term.sigmas()[4], 0.0f);

  FlowMatchSchedulerConfig inv;
  inv.invert_sigmas = true;
  FlowMatchEulerDiscreteScheduler invs(inv);
  invs.set_timesteps(2, std::nullopt);
  EXPECT_FLOAT_EQ(invs.sigmas()[0], 0.0f);
  EXPECT_FLOAT_EQ(invs.sigmas()[1], 0.5f);
  EXPECT_FLOAT_EQ(invs.sigmas()[2], 1.0f);
  EXPECT_FLOAT_EQ(invs.timesteps()[1], 500.0f);
}

TEST(FlowMatchScheduler, StepKeepsModelOutputDtype) {
  FlowMatchEulerDiscreteScheduler sched(flux_dev_config());
  sched.set_timesteps(2, sched.mu_for(256));
  const auto x = at::randn({1, 4, 8}).to(at::kBFloat16);
  const auto v = at::randn({1, 4, 8}).to(at::kBFloat16);
  const auto y = sched.step(v, 0, x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const float dt = sched.sigmas()[1] - sched.sigmas()[0];
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), (x.to(at::kFloat) + dt * v.to(at::kFloat)), 2e-2, 2e-2));
  EXPECT_THROW(sched.step(v, 2, x), Error);
  EXPECT_THROW(sched.step(v, -1, x), Error);
}

TEST(FlowMatchScheduler, ConfigErrorsNameTheField) {
  const std::string src = "scheduler_config.json";
  for (const char* f : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"}) {
    expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{f, true}}, src); }, f);
  }
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"time_shift_type", "cosine"}}, src); },
                      "time_shift_type must be \"exponential\" or \"linear\", not \"cosine\"");
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"shift", "3"}}, src); },
                      "shift must be a number");
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"use_dynamic_shifting", 1}}, src); },
                      "use_dynamic_shifting must be true or false");
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"base_shift", nullptr}}, src); },
                      "base_shift must be a number");
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"num_train_timesteps", 0}}, src); },
                      "num_train_timesteps must be at least 1, not 0");
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"shift_terminal", 1.5}}, src); },
                      "shift_terminal must be in [0, 1)");
  expect_config_error(
      [&] { FlowMatchSchedulerConfig::from_json(json{{"_class_name", "EulerDiscreteScheduler"}}, src); },
      "_class_name is \"EulerDiscreteScheduler\"");
  // Unknown fields are ignored, as diffusers ignores them.
  EXPECT_NO_THROW(FlowMatchSchedulerConfig::from_json(json{{"_diffusers_version", "0.40.0"}, {"foo", 1}}, src));

  // Values the float32 schedule cannot take, bounded at load.
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"base_shift", 1e308}}, src); },
                      "scheduler_config.json: base_shift 1e+308 is outside [-10, 10]");
  expect_config_error([&] { FlowMatchSchedulerConfig::from_json(json{{"max_shift", -1e308}}, src); },
                      "max_shift -1e+308 is outside [-10, 10]");
  EXPECT_THROW(FlowMatchSchedulerConfig::from_json(json{{"shift", 1e308}}, src), CheckpointError);
  // One step under a shift_terminal stretch divides by zero in diffusers: a request error naming steps.
  FlowMatchSchedulerConfig terminal;
  terminal.shift_terminal = 0.02;
  FlowMatchEulerDiscreteScheduler stretched(terminal);
  EXPECT_THROW(stretched.set_timesteps(1, std::nullopt), RequestError);
  EXPECT_NO_THROW(stretched.set_timesteps(2, std::nullopt));

  FlowMatchEulerDiscreteScheduler dynamic(flux_dev_config());
  expect_config_error([&] { dynamic.set_timesteps(4, std::nullopt); }, "use_dynamic_shifting");
  EXPECT_THROW(dynamic.set_timesteps(0, 1.0), RequestError);
}

}  // namespace
}  // namespace tprun::pipelines
