#pragma once
// The scheduler a denoising loop drives, whatever the family: diffusers'
// FlowMatchEulerDiscreteScheduler (FLUX.1, FLUX.2, Qwen-Image) and
// UniPCMultistepScheduler (Wan), chosen by scheduler_config.json's _class_name.
//
// The loop's contract, as diffusers' pipelines drive their schedulers:
//   s.set_timesteps(n, mu);                      // resets any multistep history
//   for (i = 0; i < s.timesteps().size(); ++i)   // may differ from n: see the class
//     latents = s.step(model(latents, s.timesteps()[i]), i, latents);
// step is called once per index, in order from 0 (a multistep scheduler keeps
// the previous model outputs; an index out of order is an internal Error).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace at {
class Tensor;
}

namespace tprun::pipelines {

// The fewest steps a scheduler config can take, and why (empty when 1).
struct StepLimit {
  int64_t min_steps = 1;
  std::string reason;
};

class Scheduler {
 public:
  virtual ~Scheduler();

  // diffusers' class name ("FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler").
  virtual std::string class_name() const = 0;

  // Whether set_timesteps needs mu (the config's use_dynamic_shifting).
  virtual bool uses_dynamic_shifting() const = 0;

  // The fewest steps set_timesteps takes for this config (shift_terminal: 2).
  virtual StepLimit step_limit() const = 0;

  // The schedule of `steps` steps; `mu` is dynamic shifting's (required with
  // use_dynamic_shifting: ConfigError without it), ignored otherwise.
  // RequestError for steps < 1 or a schedule that comes out non-finite.
  // FlowMatch: the sigmas linspace(1, 1/n, n) that FluxPipeline, the FLUX.2
  // pipelines and QwenImagePipeline pass; UniPC: its own schedule.
  virtual void set_timesteps(int64_t steps, std::optional<double> mu) = 0;

  // diffusers' scheduler.set_timesteps(steps, mu=mu) with no sigmas given, as
  // WanPipeline calls it: the scheduler's own schedule. UniPC: set_timesteps.
  // FlowMatch: linspace(sigma_max, sigma_min, n) of its shifted training
  // sigmas, shifted again (as diffusers does). Same errors as set_timesteps.
  virtual void set_own_timesteps(int64_t steps, std::optional<double> mu) = 0;

  // As diffusers' scheduler.timesteps (UniPC: integers held as floats), and
  // the sigmas, one more than the timesteps (the last: the terminal value).
  virtual const std::vector<float>& timesteps() const = 0;
  virtual const std::vector<float>& sigmas() const = 0;

  // One step from timesteps()[step_index]: the sample at the next timestep,
  // in `sample`'s dtype for UniPC and model_output's for FlowMatch (as diffusers).
  virtual at::Tensor step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample) = 0;
};

// The scheduler a scheduler_config.json names by _class_name
// ("FlowMatchEulerDiscreteScheduler" | "UniPCMultistepScheduler"), configured
// from it. Where the config has no _class_name, `fallback_class` (the class
// model_index.json gives the scheduler component) names it; "" refuses that.
// CheckpointError "<config_path>: <field> ..." for another class, no class at
// all, or a bad value (the class's own from_json checks).
std::unique_ptr<Scheduler> make_scheduler(const nlohmann::json& config, const std::string& config_path,
                                          const std::string& fallback_class = "");

// The same from the file at <path> (e.g. <pipeline>/scheduler/scheduler_config.json).
std::unique_ptr<Scheduler> make_scheduler(const std::string& path, const std::string& fallback_class = "");

// numpy's linspace(start, stop, num) in float64: start + i * (stop - start) / (num - 1), the last
// value exactly `stop` (the schedules diffusers computes in numpy).
std::vector<double> numpy_linspace(double start, double stop, int64_t num);

// The class names make_scheduler knows.
const std::vector<std::string>& scheduler_class_names();

}  // namespace tprun::pipelines
