#include "pipelines/scheduler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipelines/flow_match_scheduler.h"
#include "pipelines/unipc_scheduler.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::pipelines {

Scheduler::~Scheduler() = default;

std::vector<double> numpy_linspace(double start, double stop, int64_t num) {
  std::vector<double> y(static_cast<size_t>(num));
  const int64_t div = num - 1;
  const double delta = stop - start;
  const double step = div > 0 ? delta / static_cast<double>(div) : 0.0;
  for (int64_t i = 0; i < num; ++i) {
    const auto d = static_cast<double>(i);
    // numpy divides first where the step underflows to 0
    y[static_cast<size_t>(i)] = (div > 0 && step == 0.0 ? d / static_cast<double>(div) * delta : d * step) + start;
  }
  if (num > 1) y.back() = stop;
  return y;
}

const std::vector<std::string>& scheduler_class_names() {
  static const std::vector<std::string> names = {"FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler"};
  return names;
}

std::unique_ptr<Scheduler> make_scheduler(const nlohmann::json& config, const std::string& config_path,
                                          const std::string& fallback_class) {
  if (!config.is_object())
    throw CheckpointError(fmt::format("{}: the scheduler config must be a JSON object", config_path), true);
  std::string cls = fallback_class;
  if (auto it = config.find("_class_name"); it != config.end()) {
    if (!it->is_string())
      throw CheckpointError(fmt::format("{}: _class_name must be a string, not {}", config_path, clip_text(it->dump())),
                            true);
    cls = it->get<std::string>();
  }
  if (cls == "FlowMatchEulerDiscreteScheduler")
    return std::make_unique<FlowMatchEulerDiscreteScheduler>(FlowMatchSchedulerConfig::from_json(config, config_path));
  if (cls == "UniPCMultistepScheduler")
    return std::make_unique<UniPCMultistepScheduler>(UniPCSchedulerConfig::from_json(config, config_path));
  throw CheckpointError(fmt::format("{}: _class_name {}; tprun implements the schedulers {}", config_path,
                                    cls.empty() ? std::string("is missing (and model_index.json names no class)")
                                                : fmt::format("is '{}'", clip_text(cls)),
                                    fmt::join(scheduler_class_names(), ", ")),
                        true);
}

std::unique_ptr<Scheduler> make_scheduler(const std::string& path, const std::string& fallback_class) {
  return make_scheduler(read_json_file(path, "scheduler config"), path, fallback_class);
}

}  // namespace tprun::pipelines
