#pragma once
// The names an adapter key may give one component's modules, resolved to the
// Linear layers of its model table: the diffusers module names themselves
// (transformer_blocks.0.attn.to_q), the family's original names
// (models/lora_names.h: double_blocks.0.img_attn.qkv, split over several
// modules), and kohya's underscored form of either (matched against the
// names with '.' written as '_'; two names that underscore alike are
// ambiguous and resolve to nothing). Torch-free.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/lora_names.h"

namespace tprun::models {
struct ModelTable;
}

namespace tprun::lora {

// One Linear an original name reaches, with its shape from the table.
struct ResolvedTarget {
  std::string module;
  int64_t out = 0, in = 0;  // the module's weight [out, in]
  int64_t row_offset = 0;   // its rows of the file's B
  int64_t rows = 0;         // = out
  bool halves_swapped = false;
};

class LoraModuleIndex {
 public:
  // `config_path` names the config in errors (the family's names read it).
  LoraModuleIndex(const models::ModelTable& table, const nlohmann::json& config, const std::string& config_path);

  // The modules `name` reaches, or nullopt when it names none of them.
  std::optional<std::vector<ResolvedTarget>> resolve(const std::string& name, bool underscored) const;

  const models::LoraNames& names() const { return names_; }
  // A few of the original names the family knows (for messages).
  std::vector<std::string> example_names(size_t count) const;

 private:
  struct Linear {
    int64_t out = 0, in = 0;
  };
  std::optional<std::vector<ResolvedTarget>> resolve_dotted(const std::string& name) const;

  models::LoraNames names_;
  std::map<std::string, Linear> linears_;
  // original name (expanded) -> its targets (modules expanded)
  std::map<std::string, std::vector<models::LoraNameTarget>> originals_;
  // underscored name -> dotted name ("" when two names underscore alike)
  std::map<std::string, std::string> underscored_;
};

// Bound on the original names one family's config may expand to.
constexpr int64_t kMaxOriginalNames = 1000000;

}  // namespace tprun::lora
