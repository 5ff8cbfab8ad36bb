// UniPCMultistepScheduler and the Scheduler interface: config bounds and
// refusals, make_scheduler's dispatch, the schedule's hand-checkable values,
// the step's contract. Parity with diffusers' own scheduler over whole loops:
// tests/scripts/unipc_parity.py, which drives the probe at the end.

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/tensor_file.h"
#include "pipelines/flow_match_scheduler.h"
#include "pipelines/scheduler.h"
#include "pipelines/unipc_scheduler.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "test_data.h"

namespace tprun::pipelines {
namespace {

using nlohmann::json;

// Wan2.1-T2V-1.3B-Diffusers' scheduler/scheduler_config.json, as the hub ships it.
json wan_config() {
  return json::parse(R"({
    "_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.33.0.dev0",
    "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
    "lower_order_final": true, "num_train_timesteps": 1000, "predict_x0": true,
    "prediction_type": "flow_prediction", "rescale_betas_zero_snr": false, "sample_max_value": 1.0,
    "solver_order": 2, "solver_p": null, "solver_type": "bh2", "steps_offset": 0,
    "thresholding": false, "timestep_spacing": "linspace", "trained_betas": null,
    "use_beta_sigmas": false, "use_exponential_sigmas": false, "use_flow_sigmas": true,
    "use_karras_sigmas": false})");
}

json with(json c, const std::string& key, const json& value) {
  c[key] = value;
  return c;
}

// A CheckpointError naming the source and containing `needle`.
void expect_refused(const json& c, const std::string& needle) {
  try {
    UniPCSchedulerConfig::from_json(c, "sched.json");
    ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sched.json"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(UniPCScheduler, ReadsWanConfig) {
  const auto c = UniPCSchedulerConfig::from_json(wan_config(), "sched.json");
  EXPECT_EQ(c.prediction_type, "flow_prediction");
  EXPECT_TRUE(c.use_flow_sigmas);
  EXPECT_DOUBLE_EQ(c.flow_shift, 3.0);
  EXPECT_EQ(c.solver_order, 2);
  EXPECT_EQ(c.solver_type, "bh2");
  EXPECT_TRUE(c.predict_x0);
  EXPECT_TRUE(c.lower_order_final);
  EXPECT_TRUE(c.disable_corrector.empty());
  EXPECT_TRUE(c.trained_betas.empty());
  EXPECT_FALSE(c.shift_terminal.has_value());
  // diffusers' defaults where absent; the older solver names become bh2 as diffusers registers them.
  const auto d = UniPCSchedulerConfig::from_json(json{{"solver_type", "midpoint"}, {"unknown_key", 1}}, "s");
  EXPECT_EQ(d.prediction_type, "epsilon");
  EXPECT_EQ(d.solver_type, "bh2");
  EXPECT_FALSE(d.use_flow_sigmas);
}

TEST(UniPCScheduler, RefusesByName) {
  const json w = wan_config();
  for (const char* f : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"})
    expect_refused(with(w, f, true), f);
  expect_refused(with(w, "solver_p", json::object()), "solver_p");
  expect_refused(with(w, "solver_type", "bh1"), "solver_type");  // NaN on the last step, in diffusers too
  expect_refused(with(w, "lower_order_final", false), "lower_order_final");
  expect_refused(with(w, "predict_x0", false), "predict_x0");  // flow_prediction needs x0
  expect_refused(json{{"predict_x0", false}}, "predict_x0");       // NaN on the last step (epsilon)
  expect_refused(with(with(with(w, "final_sigmas_type", "sigma_min"), "lower_order_final", false), "solver_order", 3),
                 "lower_order_final");
  expect_refused(with(w, "_class_name", "FlowMatchEulerDiscreteScheduler"), "_class_name");
  expect_refused(with(with(w, "use_flow_sigmas", false), "shift_terminal", 0.1), "shift_terminal");
  // ... and accepts them where diffusers' result is finite.
  const json bh1 = with(with(w, "solver_type", "bh1"), "final_sigmas_type", "sigma_min");
  EXPECT_NO_THROW(UniPCSchedulerConfig::from_json(bh1, "s"));
  EXPECT_NO_THROW(UniPCSchedulerConfig::from_json(with(with(w, "lower_order_final", false), "solver_order", 1), "s"));
  const json noise_pred = {{"predict_x0", false}, {"final_sigmas_type", "sigma_min"}};
  EXPECT_NO_THROW(UniPCSchedulerConfig::from_json(noise_pred, "s"));
}

TEST(UniPCScheduler, BoundsEveryValue) {
  const json w = wan_config();
  const std::vector<std::pair<std::string, json>> bad = {
      {"num_train_timesteps", 0},       {"num_train_timesteps", 100001},  {"num_train_timesteps", 1.5},
      {"solver_order", 0},              {"solver_order", 5},              {"flow_shift", 0.0},
      {"flow_shift", -3.0},             {"flow_shift", 1e9},              {"flow_shift", "3"},
      {"beta_start", 1.0},              {"beta_end", -0.1},               {"prediction_type", "x0"},
      {"timestep_spacing", "cosine"},   {"final_sigmas_type", "one"},     {"time_shift_type", "cosine"},
      {"beta_schedule", "sigmoid"},     {"steps_offset", -1},             {"steps_offset", 1001},
      {"dynamic_thresholding_ratio", 2}, {"sample_max_value", 0.0},        {"shift_terminal", 1.0},
      {"trained_betas", json::array({0.1, 0.2})}, {"disable_corrector", json::array({"1"})},
      {"disable_corrector", 3},         {"thresholding", "yes"},          {"use_flow_sigmas", 1}};
  for (const auto& [key, value] : bad) expect_refused(with(w, key, value), key);
  std::vector<double> betas(1000, 0.01);
  betas[7] = 1.0;
  expect_refused(with(w, "trained_betas", betas), "trained_betas");
  expect_refused(with(w, "disable_corrector", std::vector<int>(10001, 1)), "disable_corrector");
}

TEST(UniPCScheduler, MakeSchedulerByClassName) {
  auto u = make_scheduler(wan_config(), "sched.json");
  EXPECT_EQ(u->class_name(), "UniPCMultistepScheduler");
  EXPECT_NE(dynamic_cast<UniPCMultistepScheduler*>(u.get()), nullptr);
  auto f = make_scheduler(json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"shift", 3.0}}, "f.json");
  EXPECT_EQ(f->class_name(), "FlowMatchEulerDiscreteScheduler");
  EXPECT_FALSE(f->uses_dynamic_shifting());
  // No _class_name: model_index.json's class for the component, else refused.
  json bare = wan_config();
  bare.erase("_class_name");
  EXPECT_EQ(make_scheduler(bare, "s.json", "UniPCMultistepScheduler")->class_name(), "UniPCMultistepScheduler");
  for (const auto& [config, needle] : std::vector<std::pair<json, std::string>>{
           {bare, "_class_name is missing"},
           {with(bare, "_class_name", "DDIMScheduler"), "'DDIMScheduler'"},
           {with(bare, "_class_name", 3), "_class_name must be a string"},
           {json::array(), "JSON object"}}) {
    try {
      make_scheduler(config, "s.json");
      ADD_FAILURE() << "accepted " << config.dump();
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("s.json"), std::string::npos) << e.what();
    }
  }
  // The limits request_options reads: shift_terminal takes 2 steps.
  EXPECT_EQ(u->step_limit().min_steps, 1);
  auto t = make_scheduler(with(wan_config(), "shift_terminal", 0.1), "s.json");
  EXPECT_EQ(t->step_limit().min_steps, 2);
  EXPECT_NE(t->step_limit().reason.find("shift_terminal"), std::string::npos);
}

TEST(UniPCScheduler, WanScheduleHandChecked) {
  auto s = make_scheduler(with(wan_config(), "flow_shift", 5.0), "s.json");
  s->set_timesteps(50, std::nullopt);
  ASSERT_EQ(s->timesteps().size(), 50u);
  ASSERT_EQ(s->sigmas().size(), 51u);
  EXPECT_EQ(s->sigmas()[0], static_cast<float>(1.0 - 1e-6));  // the first sigma, 1 pulled in by 1e-6
  EXPECT_EQ(s->timesteps()[0], 999.0f);                        // 999.999 truncated
  EXPECT_EQ(s->sigmas()[50], 0.0f);
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(s->timesteps()[i], std::floor(s->timesteps()[i]));
    if (i > 0) EXPECT_LT(s->timesteps()[i], s->timesteps()[i - 1]);
    // timestep = int(sigma * 1000) of the float64 sigma k s / (1 + (k - 1) s), s numpy's linspace(1, 0.001, 51)[i]
    const double x = static_cast<double>(i) * ((1.0 / 1000.0 - 1.0) / 50.0) + 1.0;
    const double sigma = i == 0 ? 1.0 - 1e-6 : 5.0 * x / (1.0 + 4.0 * x);
    EXPECT_NEAR(s->sigmas()[i], sigma, 1e-7) << i;
    EXPECT_EQ(s->timesteps()[i], std::floor(sigma * 1000.0)) << i;
  }
  // Epsilon on the beta schedule: linspace timesteps, rounded.
  auto e = make_scheduler(json{{"_class_name", "UniPCMultistepScheduler"}}, "e.json");
  e->set_timesteps(4, std::nullopt);
  EXPECT_EQ(e->timesteps(), (std::vector<float>{999, 749, 500, 250}));
  EXPECT_EQ(e->sigmas().back(), 0.0f);
  EXPECT_THROW(e->set_timesteps(0, std::nullopt), RequestError);
  auto dyn = make_scheduler(with(wan_config(), "use_dynamic_shifting", true), "d.json");
  EXPECT_TRUE(dyn->uses_dynamic_shifting());
  EXPECT_THROW(dyn->set_timesteps(4, std::nullopt), ConfigError);
  EXPECT_THROW(dyn->set_timesteps(4, 1e6), RequestError);  // e^mu overflows: not finite
  EXPECT_TRUE(dyn->timesteps().empty());                   // and no schedule is left to step
  EXPECT_THROW(dyn->step(at::randn({1, 4, 2, 2}), 0, at::randn({1, 4, 2, 2})), Error);
}

TEST(UniPCScheduler, FirstFlowStepIsEuler) {
  // UniPC's first step is first order: on flow sigmas, x + (s1 - s0) v.
  auto s = make_scheduler(wan_config(), "s.json");
  s->set_timesteps(10, std::nullopt);
  const at::Tensor x = at::randn({2, 4, 3, 5, 5});
  const at::Tensor v = at::randn({2, 4, 3, 5, 5});
  const at::Tensor y = s->step(v, 0, x);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  const float ds = s->sigmas()[1] - s->sigmas()[0];
  EXPECT_TRUE(at::allclose(y, x + ds * v, 1e-5, 1e-5));
  // The second step corrects with the history: it is not Euler's.
  const at::Tensor v1 = at::randn({2, 4, 3, 5, 5});
  const at::Tensor z = s->step(v1, 1, y);
  EXPECT_FALSE(at::allclose(z, y + (s->sigmas()[2] - s->sigmas()[1]) * v1, 1e-4, 1e-4));
}

TEST(UniPCScheduler, StepsInOrderAndResets) {
  auto s = make_scheduler(wan_config(), "s.json");
  const at::Tensor x = at::randn({1, 4, 2, 4, 4});
  EXPECT_THROW(s->step(x, 0, x), Error);  // before set_timesteps
  s->set_timesteps(3, std::nullopt);
  EXPECT_THROW(s->step(x, 1, x), Error);  // not the next step
  std::vector<at::Tensor> outs = {at::randn({1, 4, 2, 4, 4}), at::randn({1, 4, 2, 4, 4}), at::randn({1, 4, 2, 4, 4})};
  auto run = [&] {
    at::Tensor y = x;
    for (int64_t i = 0; i < 3; ++i) y = s->step(outs[static_cast<size_t>(i)], i, y);
    return y;
  };
  const at::Tensor first = run();
  EXPECT_THROW(s->step(x, 3, x), Error);  // past the end
  s->set_timesteps(3, std::nullopt);      // a fresh history: the same loop gives the same sample
  EXPECT_TRUE(run().equal(first));
  // bf16 model outputs on a float32 sample (WanPipeline's transformer dtype): the sample's dtype.
  s->set_timesteps(3, std::nullopt);
  EXPECT_EQ(s->step(outs[0].to(at::kBFloat16), 0, x).scalar_type(), at::kFloat);
  EXPECT_THROW(s->step(x.flatten(), 1, x.flatten()), Error);  // [B, C, ...]
}

TEST(UniPCScheduler, FlowMatchThroughTheInterface) {
  // The interface's step is FlowMatch's own (byte-identical).
  const json c = {{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"shift", 3.0}};
  auto s = make_scheduler(c, "f.json");
  FlowMatchEulerDiscreteScheduler direct(FlowMatchSchedulerConfig::from_json(c, "f.json"));
  s->set_timesteps(4, std::nullopt);
  direct.set_timesteps(4, std::nullopt);
  EXPECT_EQ(s->timesteps(), direct.timesteps());
  EXPECT_EQ(s->sigmas(), direct.sigmas());
  const at::Tensor x = at::randn({1, 16, 8});
  const at::Tensor v = at::randn({1, 16, 8});
  const FlowMatchEulerDiscreteScheduler& const_direct = direct;
  EXPECT_TRUE(s->step(v, 2, x).equal(const_direct.step(v, 2, x)));
}

TEST(UniPCScheduler, FlowMatchOwnSchedule) {
  // diffusers' FlowMatch set_timesteps(n) with no sigmas (WanPipeline's call): linspace(sigma_max, sigma_min)
  // of the shifted training sigmas, shifted again. shift 1: t = linspace(1000, 1, n), sigma = t / 1000.
  auto s = make_scheduler(json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}}, "f.json");
  s->set_own_timesteps(4, std::nullopt);
  EXPECT_EQ(s->timesteps(), (std::vector<float>{1000, 667, 334, 1}));
  EXPECT_EQ(s->sigmas(), (std::vector<float>{1.0f, 0.667f, 0.334f, 0.001f, 0.0f}));
  // shift 3 is applied twice: sigma_min 0.001 -> 0.003/1.002 -> shifted again.
  auto k = make_scheduler(json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"shift", 3.0}}, "f.json");
  k->set_own_timesteps(2, std::nullopt);
  const double once = 3.0 * 0.001 / (1.0 + 2.0 * 0.001);
  EXPECT_NEAR(k->sigmas()[1], 3.0 * once / (1.0 + 2.0 * once), 1e-7);
  EXPECT_EQ(k->sigmas()[0], 1.0f);
  auto t = make_scheduler(json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"shift_terminal", 0.1}}, "f.json");
  EXPECT_THROW(t->set_own_timesteps(1, std::nullopt), RequestError);  // the stretch divides by 1 - 1
  t->set_own_timesteps(3, std::nullopt);
  EXPECT_NEAR(t->sigmas()[2], 0.1f, 1e-6);
}

// ---- the parity script's probe ------------------------------------------------

// Runs the cases unipc_parity.py wrote (UniPC's, and FlowMatch's own schedule) (TPRUN_UNIPC_PROBE: a folder with
// cases.json and inputs.safetensors) through make_scheduler and writes each
// case's timesteps, sigmas and every step's sample to outputs.safetensors.
TEST(UniPCSchedulerProbe, Loops) {
  const char* dir = std::getenv("TPRUN_UNIPC_PROBE");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "TPRUN_UNIPC_PROBE not set (driven by unipc_parity.py)";
  const std::string root = dir;
  const json cases = read_json_file(root + "/cases.json", "probe cases");
  const auto inputs = checkpoint::read_tensor_file(root + "/inputs.safetensors");
  std::map<std::string, at::Tensor> out;
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    auto s = make_scheduler(c.at("config"), name);
    std::optional<double> mu;
    if (c.contains("mu")) mu = c.at("mu").get<double>();
    s->set_own_timesteps(c.at("steps").get<int64_t>(), mu);  // as WanPipeline: diffusers' set_timesteps(n, mu=mu)
    out[name + ".timesteps"] = at::tensor(s->timesteps());
    out[name + ".sigmas"] = at::tensor(s->sigmas());
    const at::Tensor& outputs = inputs.at(name + ".outputs");
    ASSERT_GE(outputs.size(0), static_cast<int64_t>(s->timesteps().size())) << name;
    const bool bf16 = c.value("model_dtype", "fp32") == "bf16";
    at::Tensor x = inputs.at(name + ".sample");
    std::vector<at::Tensor> samples;
    for (size_t i = 0; i < s->timesteps().size(); ++i) {
      const at::Tensor v = bf16 ? outputs[static_cast<int64_t>(i)].to(at::kBFloat16) : outputs[static_cast<int64_t>(i)];
      x = s->step(v, static_cast<int64_t>(i), x);
      samples.push_back(x);
    }
    out[name + ".samples"] = at::stack(samples);
  }
  checkpoint::write_tensor_file_f32(root + "/outputs.safetensors", out);
}

}  // namespace
}  // namespace tprun::pipelines
