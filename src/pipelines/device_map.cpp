#include "pipelines/device_map.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "memory/offload_plan.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "runtime/error.h"
#include "runtime/size_string.h"

namespace tprun::pipelines {
namespace {

int64_t dtype_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

struct Sized {
  std::string name;
  uint64_t bytes = 0;
  std::vector<std::string> tensors;
};

// The components tprun has a model for, sized from their tables in the
// compute dtype (no weight read); tokenizers and schedulers are skipped.
std::vector<Sized> size_components(const checkpoint::PipelineFolder& folder, const PipelineOptions& options) {
  std::vector<Sized> comps;
  for (const auto& c : folder.components) {
    std::string config_path;
    nlohmann::json config;
    try {
      config = models::read_component_config(c.path, &config_path);
    } catch (const Error&) {
      continue;  // a tokenizer or scheduler: nothing to place
    }
    const auto table = models::model_table_for(config, config_path, options.component_base);
    if (!table) continue;
    Sized s;
    s.name = c.name;
    for (const auto& t : table->tensors) {
      if (t.optional) continue;
      uint64_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      s.bytes += n * static_cast<uint64_t>(t.dtype == "fp32" ? 4 : dtype_bytes(options.dtype));
      s.tensors.push_back(t.name);
    }
    comps.push_back(std::move(s));
  }
  return comps;
}

// "balanced": largest first on this rank's accelerator, then the host, then
// disk, each under its max_memory budget (none: no limit).
std::vector<memory::DevicePlacement> place_balanced(const std::vector<Sized>& comps, const memory::MemoryOptions& mem,
                                                    const std::string& device) {
  const int own_index = memory::accelerator_index(device);
  const bool accel = own_index >= 0;
  const std::string own = accel ? std::to_string(own_index) : "";
  std::map<std::string, uint64_t> budget;
  for (const auto& [dev, bytes] : mem.max_memory) {
    const int target = *memory::device_map_target(dev);
    if (target >= 0 && target != own_index) {
      throw ConfigError(fmt::format("memory.max_memory.\"{}\": device {} is not this rank's ({})", dev, dev, device),
                        true);
    }
    budget[target >= 0 ? own : "cpu"] = bytes;
  }
  auto fits = [&](const std::string& dev, uint64_t bytes) {
    auto it = budget.find(dev);
    if (it == budget.end()) return true;
    if (it->second < bytes) return false;
    it->second -= bytes;
    return true;
  };
  std::vector<const Sized*> order;
  for (const auto& c : comps) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const Sized* a, const Sized* b) { return a->bytes > b->bytes; });
  std::vector<memory::DevicePlacement> resolved;
  for (const Sized* c : order) {
    std::string where = "disk";
    if (accel && fits(own, c->bytes)) {
      where = own;
    } else if (fits("cpu", c->bytes)) {
      where = "cpu";
    }
    resolved.emplace_back(c->name, where);
  }
  return resolved;
}

// An explicit map: every entry names a component with weights, or a module
// inside one (a prefix of some tensor's name); taken as written.
std::vector<memory::DevicePlacement> check_explicit_map(const std::vector<Sized>& comps,
                                                        const memory::MemoryOptions& mem,
                                                        const std::string& folder_path) {
  if (!mem.max_memory.empty()) {
    throw ConfigError("memory.max_memory: budgets apply to memory.device_map = \"balanced\"; an explicit map "
                      "places every entry where it says",
                      true);
  }
  std::vector<memory::DevicePlacement> resolved;
  for (const auto& [name, dev] : mem.device_map) {
    const std::string comp = name.substr(0, name.find('.'));
    auto found = std::find_if(comps.begin(), comps.end(), [&](const Sized& k) { return k.name == comp; });
    if (found == comps.end()) {
      std::vector<std::string> known;
      for (const auto& k : comps) known.push_back(k.name);
      throw ConfigError(fmt::format("memory.device_map.\"{}\": {} is not a component of {} with weights "
                                    "(components: {})",
                                    name, comp, folder_path, fmt::join(known, ", ")),
                        true);
    }
    const Sized* c = &*found;
    const std::string module = name.size() > comp.size() ? name.substr(comp.size() + 1) : "";
    const bool any = std::any_of(c->tensors.begin(), c->tensors.end(),
                                 [&](const std::string& t) { return memory::module_encloses(module, t); });
    if (!any) {
      throw ConfigError(fmt::format("memory.device_map.\"{}\": {} has no module {} (its tensors are named like "
                                    "'{}')",
                                    name, comp, module, c->tensors.empty() ? "" : c->tensors.front()),
                        true);
    }
    resolved.emplace_back(name, dev);
  }
  return resolved;
}

// The result in diffusers' hf_device_map form, with the component sizes.
void log_device_map(const std::vector<memory::DevicePlacement>& resolved, const std::vector<Sized>& comps,
                    const std::string& strategy, const std::string& dtype) {
  nlohmann::ordered_json shown = nlohmann::ordered_json::object();
  for (const auto& [name, dev] : resolved) shown[name] = dev;
  std::vector<std::string> sizes;
  for (const auto& c : comps) sizes.push_back(fmt::format("{} {}", c.name, format_size(c.bytes)));
  spdlog::info("memory.device_map{}: hf_device_map {} (component sizes in {}: {})",
               strategy.empty() ? "" : " " + strategy, shown.dump(), dtype, fmt::join(sizes, ", "));
}

}  // namespace

PipelineOptions resolve_device_map(const checkpoint::PipelineFolder& folder, const parallel::TpContext& tp,
                                   PipelineOptions options) {
  memory::MemoryOptions& mem = options.component_base.memory;
  if (!mem.device_mapped()) {
    if (!mem.max_memory.empty()) {
      throw ConfigError("memory.max_memory: budgets apply to memory.device_map = \"balanced\", which is not set", true);
    }
    return options;
  }
  memory::refuse_device_map_with_tp(mem, tp.size);
  const std::vector<Sized> comps = size_components(folder, options);
  std::vector<memory::DevicePlacement> resolved = mem.device_map_strategy == "balanced"
                                                      ? place_balanced(comps, mem, options.device)
                                                      : check_explicit_map(comps, mem, folder.path);
  log_device_map(resolved, comps, mem.device_map_strategy, options.dtype);
  mem.device_map = std::move(resolved);
  mem.device_map_strategy.clear();
  mem.max_memory.clear();
  return options;
}

}  // namespace tprun::pipelines
