#pragma once
// The original module names a family's adapters are trained under (BFL's
// "double_blocks.0.img_attn.qkv", Wan's "blocks.0.self_attn.q", kohya's
// underscored forms of them) and the diffusers modules each one reaches, as
// data. Every family registers its map next to its model, by class name:
//
//   TPRUN_REGISTER_LORA_NAMES("FluxTransformer2DModel", flux_lora_names);
//
// where flux_lora_names(config, config_path) reads the component's
// config.json (checked and bounded as the model reads it) and returns the
// names with their block counts. lora/lora_file_map.h reads these maps; the
// diffusers names themselves need no map (they are the table's modules).
// Torch-free.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tprun::models {

// Where one original module's low-rank term lands: the rows
// [row_offset, row_offset + rows) of its up (B) matrix belong to `module`,
// its down (A) matrix is shared. rows = 0: all of B (a one-to-one rename).
struct LoraNameTarget {
  std::string module;  // "transformer_blocks.{i}.attn.to_q"
  int64_t row_offset = 0;
  int64_t rows = 0;
  // B's two row halves are exchanged: BFL's final_layer.adaLN_modulation
  // gives (shift, scale) where diffusers' norm_out.linear gives (scale, shift).
  bool halves_swapped = false;
};

// One original name, with "{i}" for a block index when `blocks` > 0 (the
// pattern is expanded for i in [0, blocks)).
struct LoraNameEntry {
  std::string original;  // "double_blocks.{i}.img_attn.qkv"
  int64_t blocks = 0;
  std::vector<LoraNameTarget> targets;  // "transformer_blocks.{i}.attn.to_q", ...
};

struct LoraNames {
  std::vector<LoraNameEntry> entries;
  // diffusers' loader for the family drops the `.alpha` tensors of a
  // diffusers / PEFT-format file (lora_A / lora_B keys) and scales those
  // modules by 1 (Qwen-Image's converter pops them unread); kohya-format
  // alphas still count.
  bool peft_alpha_ignored = false;
};

// config.json of the component -> its names. Throws CheckpointError naming
// `config_path` and the field for a config the model would refuse.
using LoraNamesFn = std::function<LoraNames(const nlohmann::json& config, const std::string& config_path)>;

// The names registered for class `cls`, or an empty map (no original names:
// only diffusers names reach the class's modules).
LoraNames lora_names_for(const std::string& cls, const nlohmann::json& config, const std::string& config_path);
// Whether `cls` registered a map.
bool has_lora_names(const std::string& cls);

// The pattern with "{i}" replaced by `index`.
std::string expand_block_pattern(const std::string& pattern, int64_t index);

namespace detail {
bool register_lora_names(const char* cls, LoraNamesFn fn);
}

}  // namespace tprun::models

#define TPRUN_LORA_NAMES_CONCAT_(a, b) a##b
#define TPRUN_LORA_NAMES_CONCAT(a, b) TPRUN_LORA_NAMES_CONCAT_(a, b)
#define TPRUN_REGISTER_LORA_NAMES(cls, fn)                                                          \
  static const bool TPRUN_LORA_NAMES_CONCAT(tprun_lora_names_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::models::detail::register_lora_names(cls, fn)
