#include "models/model_table.h"

#include "checkpoint/safetensors_header.h"
#include "checkpoint/weight_source.h"

#include <algorithm>
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
void register_autoencoder_kl_table();
void register_text_encoder_tables();

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

namespace {

// "transformer_blocks.*.attn.to_q" matches "transformer_blocks.12.attn.to_q".
bool pattern_matches(const std::string& pattern, const std::string& module) {
  const size_t star = pattern.find('*');
  if (star == std::string::npos) return pattern == module;
  const std::string head = pattern.substr(0, star), tail = pattern.substr(star + 1);
  if (module.size() < head.size() + tail.size() + 1) return false;
  if (module.compare(0, head.size(), head) != 0) return false;
  if (module.compare(module.size() - tail.size(), tail.size(), tail) != 0) return false;
  const std::string index = module.substr(head.size(), module.size() - head.size() - tail.size());
  return !index.empty() && index.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

void apply_tp_plan(ModelTable& table, const TpPlan& plan) {
  using checkpoint::ShardStyle;
  for (const auto& entry : plan) {
    if (std::count(entry.pattern.begin(), entry.pattern.end(), '*') > 1) {
      throw ConfigError(fmt::format("tp_plan key '{}' of {} has more than one '*'", entry.pattern, table.cls));
    }
    bool matched = false;
    for (auto& t : table.tensors) {
      const size_t dot = t.name.rfind('.');
      if (dot == std::string::npos || !pattern_matches(entry.pattern, t.name.substr(0, dot))) continue;
      if (!t.plan_key.empty()) {
        throw ConfigError(fmt::format("tensor '{}' of {} is matched by tp_plan keys '{}' and '{}'", t.name,
                                      table.cls, t.plan_key, entry.pattern));
      }
      matched = true;
      t.plan_key = entry.pattern;
      const bool is_weight = t.name.compare(dot + 1, std::string::npos, "weight") == 0;
      if (is_weight) {
        t.style = entry.style;
        t.blocks = entry.blocks;
      } else if (entry.style == ShardStyle::Colwise || entry.style == ShardStyle::PackedColwise) {
        t.style = entry.style;  // the bias is split with the output features
        t.blocks = entry.blocks;
      } else {
        t.style = ShardStyle::Replicated;  // added once, after the reduce
      }
    }
    if (!matched) {
      throw ConfigError(fmt::format("tp_plan key '{}' matches no module of {}", entry.pattern, table.cls));
    }
  }
}

bool register_model_table(const std::string& cls, TableBuilder builder) {
  registry()[cls] = std::move(builder);
  return true;
}

std::optional<ModelTable> model_table_for(const nlohmann::json& config, const std::string& config_path,
                                          const TableOptions& options) {
  static const bool once = [] {
    register_flux_table();
    register_autoencoder_kl_table();
    register_text_encoder_tables();
    return true;
  }();
  (void)once;
  // diffusers configs name the class in "_class_name", transformers configs
  // in "architectures"[0] ("CLIPTextModel", "T5EncoderModel").
  if (!config.is_object()) return std::nullopt;
  std::string cls;
  if (config.contains("_class_name") && config["_class_name"].is_string()) {
    cls = config["_class_name"].get<std::string>();
  } else if (config.contains("architectures") && config["architectures"].is_array() &&
             !config["architectures"].empty() && config["architectures"][0].is_string()) {
    cls = config["architectures"][0].get<std::string>();
  } else {
    return std::nullopt;
  }
  auto it = registry().find(cls);
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

int64_t config_positive(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                        int64_t fallback) {
  const int64_t v = config_int_or_null(config, field, config_path).value_or(fallback);
  if (v <= 0) throw CheckpointError(fmt::format("{}: field '{}' must be positive, got {}", config_path, field, v));
  return v;
}

int64_t config_int(const nlohmann::json& config, const std::string& field, const std::string& config_path) {
  auto v = config_int_or_null(config, field, config_path);
  if (!v) throw CheckpointError(fmt::format("{}: required field '{}' is missing", config_path, field));
  return *v;
}

void validate_tp_plan(const ModelTable& table, const checkpoint::WeightSource& source, int tp) {
  if (tp < 1) throw ConfigError(fmt::format("tp must be at least 1, got {}", tp), true);
  if (table.num_attention_heads > 0 && table.num_attention_heads % tp != 0) {
    throw ConfigError(fmt::format("tp {} does not divide num_attention_heads {} of {}; choose a tp that divides {}", tp,
                                  table.num_attention_heads, source.path(), table.num_attention_heads),
                      true);
  }
  for (const auto& spec : table.tensors) {
    if (!source.contains(spec.name)) {
      if (spec.optional) continue;
      throw CheckpointError(fmt::format("tensor '{}' is missing from {}", spec.name, source.path()), true);
    }
    const auto stored = source.describe(spec.name);
    if (stored.shape != spec.shape) {
      throw CheckpointError(fmt::format("tensor '{}' has wrong shape; expected {}, got {} (in {})", spec.name,
                                        checkpoint::shape_string(spec.shape), checkpoint::shape_string(stored.shape),
                                        source.path()),
                            true);
    }
    auto need = [&](int64_t size, const char* what) {
      if (size % tp != 0) {
        throw ConfigError(fmt::format("tensor '{}': {} {} does not divide by tp {}", spec.name, what, size, tp), true);
      }
    };
    switch (spec.style) {
      case checkpoint::ShardStyle::Replicated: break;
      case checkpoint::ShardStyle::Colwise: need(spec.shape[0], "output dim"); break;
      case checkpoint::ShardStyle::Rowwise:
      case checkpoint::ShardStyle::RowwiseSplitInput: need(spec.shape.at(1), "input dim"); break;
      case checkpoint::ShardStyle::PackedColwise:
      case checkpoint::ShardStyle::PackedRowwise:
        for (int64_t b : spec.blocks) need(b, "packed block");
        break;
    }
  }
}

}  // namespace tprun::models
