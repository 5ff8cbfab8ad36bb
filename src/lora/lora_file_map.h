#pragma once
// Reads an adapter file's header and maps its keys onto the modules of the
// components a pipeline adapts: the LoraLayout that lora_slices.h loads each
// rank's part of. Formats (lora_key_format.h): diffusers / PEFT with their
// prefixes, kohya / sd-scripts, the family's original names
// (models/lora_names.h). Scales, as diffusers' load_lora_weights (with peft)
// computes them:
//   - lora_down / lora_up (kohya): alpha / r, alpha from the pair's ".alpha"
//     tensor, or r where it has none (diffusers folds the same factor in);
//   - lora_A / lora_B: with the header's lora_adapter_metadata for the
//     component (lora_metadata.h): its r / lora_alpha / rank_pattern /
//     alpha_pattern / use_rslora, the file's rank checked against it; else the
//     pair's ".alpha" / r, or 1 without one (alpha = r), and 1 for a family
//     whose diffusers loader drops those alphas (Qwen-Image).
// Only the header is read, and the few bytes of each ".alpha" scalar.
//
// Refused (CheckpointError naming the file and the key, raised identically
// on every rank): keys that map to no module (unless !strict: then listed in
// skipped_keys), a down without its up or the other way round, an alpha
// without both, tensors that are not 2-D or not floating point, lora_A not
// [r, in] or lora_B not [the module's out rows, r] (both shapes named:
// diffusers pads a too-narrow lora_A and fails late on a too-wide one), rank
// 0 or larger than the layer, an alpha that is not one finite positive
// number, metadata that is not JSON or has fields of the wrong type, alpha
// tensors together with metadata (diffusers refuses both), a module adapted
// twice, more than kMaxLoraKeys keys, and a file that adapts no module at all.

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lora/lora_layout.h"

namespace tprun::checkpoint {
class ComponentCheckpoint;
}
namespace tprun::models {
struct ModelTable;
}

namespace tprun::lora {

// One component an adapter may reach, as the pipeline loads it.
struct LoraComponentTarget {
  std::string component;                    // "transformer", "text_encoder" (the file's key prefix)
  const models::ModelTable* table = nullptr;  // its Linear modules ("<module>.weight", kind Linear)
  const nlohmann::json* config = nullptr;   // its config.json (the family's original names read it)
  // Raw key prefixes the pipeline drops as diffusers does (they land in
  // skipped_keys whatever `strict` says). FLUX.1's: its T5's keys
  // {"lora_te2_", "text_encoders.t5xxl.", "text_encoder_2."}.
  std::vector<std::string> dropped_prefixes;
};

constexpr size_t kMaxLoraKeys = 100000;

// `file`: ComponentCheckpoint::open of the adapter's .safetensors file.
LoraLayout map_lora_file(const checkpoint::ComponentCheckpoint& file,
                         const std::vector<LoraComponentTarget>& components, bool strict);

}  // namespace tprun::lora
