#include "models/model_table.h"

#include <map>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::models {
namespace {

std::map<std::string, TableBuilder>& registry() {
  static std::map<std::string, TableBuilder> r;
  return r;
}

}  // namespace

// Defined by each model's table file; referenced here so a static library
// keeps them.
void register_flux_table();

const TensorSpec* ModelTable::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

checkpoint::ShardRequest ModelTable::request(const std::string& name, int tp_rank, int tp_size) const {
  checkpoint::ShardRequest r;
  r.tp_rank = tp_rank;
  r.tp_size = tp_size;
  if (const TensorSpec* t = find(name)) {
    r.style = t->style;
    r.blocks = t->blocks;
    r.blocks_absolute = !t->blocks.empty();
  }
  return r;
}

bool register_model_table(const std::string& cls, TableBuilder builder) {
  registry()[cls] = std::move(builder);
  return true;
}

std::optional<ModelTable> model_table_for(const nlohmann::json& config, const std::string& config_path,
                                          const TableOptions& options) {
  static const bool once = [] {
    register_flux_table();
    return true;
  }();
  (void)once;
  if (!config.is_object() || !config.contains("_class_name") || !config["_class_name"].is_string())
    return std::nullopt;
  auto it = registry().find(config["_class_name"].get<std::string>());
  if (it == registry().end()) return std::nullopt;
  return it->second(config, config_path, options);
}

std::optional<int64_t> config_int_or_null(const nlohmann::json& config, const std::string& field,
                                          const std::string& config_path) {
  if (!config.contains(field) || config[field].is_null()) return std::nullopt;
  const auto& v = config[field];
  if (!v.is_number_integer()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be an integer, found {}", config_path, field, v.dump()));
  }
  return v.get<int64_t>();
}

int64_t config_int(const nlohmann::json& config, const std::string& field, const std::string& config_path) {
  auto v = config_int_or_null(config, field, config_path);
  if (!v) throw CheckpointError(fmt::format("{}: required field '{}' is missing", config_path, field));
  return *v;
}

}  // namespace tprun::models
