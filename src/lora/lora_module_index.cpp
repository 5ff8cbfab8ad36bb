#include "lora/lora_module_index.h"

#include <fmt/format.h>

#include "lora/lora_key_format.h"
#include "models/model_table.h"
#include "runtime/error.h"

namespace tprun::lora {
namespace {

constexpr const char* kWeightSuffix = ".weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

LoraModuleIndex::LoraModuleIndex(const models::ModelTable& table, const nlohmann::json& config,
                                 const std::string& config_path)
    : names_(models::lora_names_for(table.cls, config, config_path)) {
  const std::string suffix = kWeightSuffix;
  for (const models::TensorSpec& t : table.tensors) {
    if (t.kind != models::TensorKind::Linear || t.shape.size() != 2 || !ends_with(t.name, suffix)) continue;
    linears_[t.name.substr(0, t.name.size() - suffix.size())] = {t.shape[0], t.shape[1]};
  }
  int64_t expanded = 0;
  for (const models::LoraNameEntry& e : names_.entries) {
    const int64_t n = e.blocks > 0 ? e.blocks : 1;
    expanded += n;
    if (expanded > kMaxOriginalNames) {
      throw CheckpointError(fmt::format("{}: the block counts expand {}'s adapter names past {}", config_path,
                                        table.cls, kMaxOriginalNames),
                            true);
    }
    for (int64_t i = 0; i < n; ++i) {
      std::vector<models::LoraNameTarget> targets = e.targets;
      for (auto& t : targets) t.module = e.blocks > 0 ? models::expand_block_pattern(t.module, i) : t.module;
      originals_[e.blocks > 0 ? models::expand_block_pattern(e.original, i) : e.original] = std::move(targets);
    }
  }
  auto add_underscored = [&](const std::string& dotted) {
    auto [it, inserted] = underscored_.emplace(underscored(dotted), dotted);
    if (!inserted && it->second != dotted) it->second.clear();  // ambiguous
  };
  for (const auto& [module, shape] : linears_) add_underscored(module);
  for (const auto& [original, targets] : originals_) add_underscored(original);
}

std::optional<std::vector<ResolvedTarget>> LoraModuleIndex::resolve_dotted(const std::string& name) const {
  if (auto it = linears_.find(name); it != linears_.end()) {
    return std::vector<ResolvedTarget>{{name, it->second.out, it->second.in, 0, it->second.out, false}};
  }
  auto it = originals_.find(name);
  if (it == originals_.end()) return std::nullopt;
  std::vector<ResolvedTarget> out;
  for (const models::LoraNameTarget& t : it->second) {
    auto m = linears_.find(t.module);
    if (m == linears_.end()) return std::nullopt;  // a module this model does not have (Wan's I2V projections)
    const int64_t rows = t.rows > 0 ? t.rows : m->second.out;
    if (rows != m->second.out || (t.halves_swapped && m->second.out % 2 != 0)) {
      throw Error(Error::Kind::Internal,
                  fmt::format("adapter name '{}' gives module '{}' {} rows but its table has {}", name, t.module,
                              rows, m->second.out),
                  true);
    }
    out.push_back({t.module, m->second.out, m->second.in, t.row_offset, rows, t.halves_swapped});
  }
  return out;
}

std::optional<std::vector<ResolvedTarget>> LoraModuleIndex::resolve(const std::string& name,
                                                                    bool is_underscored) const {
  if (!is_underscored) return resolve_dotted(name);
  auto it = underscored_.find(name);
  if (it == underscored_.end() || it->second.empty()) return std::nullopt;
  return resolve_dotted(it->second);
}

std::vector<std::string> LoraModuleIndex::example_names(size_t count) const {
  std::vector<std::string> out;
  for (const auto& [original, targets] : originals_) {
    if (out.size() >= count) break;
    out.push_back(original);
  }
  return out;
}

}  // namespace tprun::lora
