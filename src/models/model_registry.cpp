#include "models/model_registry.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/model_config.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

std::map<std::string, ModelFamily>& registry() {
  static std::map<std::string, ModelFamily> r;  // constructed on first use (static init order safe)
  return r;
}

}  // namespace

namespace detail {
bool register_model_family(const char* cls, ModelFamily family) {
  registry()[cls] = std::move(family);
  return true;
}
}  // namespace detail

const ModelFamily* find_model_family(const std::string& cls) {
  auto it = registry().find(cls);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> names;
  for (const auto& [name, family] : registry()) names.push_back(name);
  return names;
}

namespace {

// A config whose _class_name is there but not a string names no class: say so
// (with the value) rather than treating it as missing.
void check_class_name(const nlohmann::json& config, const std::string& config_path) {
  if (config.is_object() && config.contains("_class_name") && !config["_class_name"].is_string()) {
    throw CheckpointError(fmt::format("{}: _class_name is not a string (found {})", config_path,
                                      clip_text(config["_class_name"].dump())),
                          true);
  }
}

}  // namespace

std::optional<ModelTable> model_table_for(const nlohmann::json& config, const std::string& config_path,
                                          const ModelOptions& options, const TensorCensus* census) {
  check_class_name(config, config_path);
  const ModelFamily* f = find_model_family(config_class(config));
  if (!f) return std::nullopt;
  return f->table(config, config_path, options, census);
}

std::unique_ptr<Model> load_model(checkpoint::WeightSource& source, const nlohmann::json& config,
                                  const std::string& config_path, const parallel::TpContext& tp,
                                  const ModelOptions& options) {
  check_class_name(config, config_path);
  const std::string cls = config_class(config);
  const ModelFamily* f = find_model_family(cls);
  if (!f) {
    throw ConfigError(fmt::format("{}: class '{}' is not a model tprun can run (known: {})", config_path,
                                  cls.empty() ? "(none: no _class_name or architectures)" : cls,
                                  fmt::join(model_family_names(), ", ")),
                      true);
  }
  return f->load(source, config, config_path, tp, options);
}

}  // namespace tprun::models
