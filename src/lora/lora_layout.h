#pragma once
// What one adapter file holds, mapped onto the modules of the components it
// adapts: for every adapted Linear, the file's down (A, "lora_A" /
// "lora_down") and up (B, "lora_B" / "lora_up") tensors and the factor its
// term is scaled by. The formats (diffusers / PEFT with their prefixes,
// kohya / sd-scripts, the original BFL / Wan names) and each family's names
// are read by map_lora_file (lora_file_map.h); loading a rank's slices of a
// layout is lora_slices.h's.

#include <cstdint>
#include <string>
#include <vector>

namespace tprun::lora {

struct LoraModulePart {
  std::string module;    // the model's module, as diffusers names it ("transformer_blocks.0.attn.to_q")
  std::string down_key;  // the file's A tensor, [r, in]
  std::string up_key;    // the file's B tensor, [rows, r]
  // The rows of B that belong to this module: [up_row_offset, up_row_offset
  // + up_rows). A fused original module (kohya's img_attn_qkv, FLUX.1's
  // single-block linear1) is split over several modules this way, A shared.
  int64_t up_row_offset = 0;
  int64_t up_rows = 0;   // = the module's out features
  // The two halves of those rows are exchanged: the module's rows
  // [0, up_rows / 2) are B's rows [up_row_offset + up_rows / 2, up_row_offset
  // + up_rows) and the other way round (BFL's final_layer.adaLN_modulation
  // gives shift, scale where diffusers' norm_out.linear gives scale, shift;
  // diffusers' kohya FLUX.1 converter swaps B's halves the same way).
  bool up_halves_swapped = false;
  int64_t rank = 0;      // r
  // alpha / r (alpha / sqrt(r) with rslora), with alpha from the file's
  // ".alpha" tensor, its lora_adapter_metadata, or r where it has neither.
  double alpha_scale = 1.0;
};

struct LoraComponentLayout {
  std::string component;  // "transformer", "text_encoder"
  std::vector<LoraModulePart> parts;  // in the file's key order
};

struct LoraLayout {
  std::string path;  // the file
  std::vector<LoraComponentLayout> components;  // only those with parts
  // Keys left out: mapped to no module (lora_strict = false), or of a
  // component the pipeline drops as diffusers does (FLUX.1's T5 keys).
  std::vector<std::string> skipped_keys;
  uint64_t file_bytes = 0;
};

}  // namespace tprun::lora
