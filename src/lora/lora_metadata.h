#pragma once
// diffusers' adapter metadata: the safetensors header's
// "lora_adapter_metadata" entry, a JSON object of each component's LoraConfig
// fields under the component's prefix ("transformer.r", "transformer.lora_alpha",
// "transformer.rank_pattern", "transformer.alpha_pattern",
// "transformer.use_rslora"; diffusers' save_lora_weights writes it and
// load_lora_adapter builds the LoraConfig from it). PEFT reads a module's r
// and alpha from the first pattern key k (in the file's order) for which the
// module name fully matches the regular expression "(.*\.)?(k)"; else the
// config's r / lora_alpha (PEFT's defaults, 8 and 8, where the metadata has
// none). Torch-free.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace re2 {
class RE2;
}

namespace tprun::lora {

// Bounds of what a header may hold.
constexpr size_t kMaxMetadataPatterns = 100000;
constexpr int64_t kMaxMetadataRank = int64_t{1} << 20;

struct LoraPattern {
  std::string key;
  std::shared_ptr<const re2::RE2> regex;  // "(.*\.)?(key)", matched whole
  double value = 0;
};

struct LoraMetadata {
  int64_t r = 8;
  double lora_alpha = 8;
  std::vector<LoraPattern> rank_pattern, alpha_pattern;  // in the file's order
  bool use_rslora = false;

  int64_t rank_for(const std::string& module) const;
  double alpha_for(const std::string& module) const;
  // alpha / r, or alpha / sqrt(r) with rslora, for `module`.
  double scale_for(const std::string& module) const;
};

// Each component's metadata ("transformer" -> ...), from the header's
// __metadata__ map; empty when it has no lora_adapter_metadata entry.
// CheckpointError naming `file` and the field for an entry that is not a
// JSON object, a field of the wrong type or out of bounds, or a pattern that
// is not a valid regular expression.
std::map<std::string, LoraMetadata> read_lora_metadata(const std::string& file,
                                                       const std::map<std::string, std::string>& header_metadata);

inline constexpr const char* kLoraMetadataKey = "lora_adapter_metadata";

}  // namespace tprun::lora
