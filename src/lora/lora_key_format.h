#pragma once
// How one key of an adapter file is read: which component it adapts, the
// module name it gives (dotted, as diffusers or the original checkpoint
// names modules, or underscored, as kohya / sd-scripts writes them) and which
// tensor of the pair it is. The formats diffusers' load_lora_weights accepts:
//
//   transformer.<module>.lora_A.weight / .lora_B.weight / .alpha   diffusers / PEFT
//   base_model.model.<module>..., diffusion_model.<module>...      PEFT, ai-toolkit, ComfyUI
//   <module>.lora_A.weight (no prefix)                             taken as the transformer's
//   text_encoder.<module>..., text_encoders.clip_l.transformer.    the (CLIP) text encoder
//   lora_unet_<name>.lora_down.weight / .lora_up.weight / .alpha  kohya / sd-scripts
//   lora_transformer_<name>..., lora_te1_ / lora_te_ / lora_te2_   kohya
//
// Torch-free.

#include <optional>
#include <string>

namespace tprun::lora {

enum class LoraRole { Down, Up, Alpha };

// lora_A / lora_B (diffusers, PEFT) or lora_down / lora_up (kohya); alpha
// keys take the style of the pair they belong to.
enum class LoraKeyStyle { Peft, Kohya };

struct LoraKey {
  std::string component;  // "transformer", "text_encoder", "text_encoder_2"
  std::string name;       // "transformer_blocks.0.attn.to_q", "double_blocks_0_img_attn_qkv"
  bool underscored = false;  // a kohya name: '.' written as '_'
  LoraRole role = LoraRole::Down;
  LoraKeyStyle style = LoraKeyStyle::Peft;  // meaningless for Alpha
  // The component and name the pair is known by (alpha keys find their pair
  // by it): component + '\n' + name.
  std::string pair_id() const { return component + '\n' + name; }
};

// nullopt for a key of no adapter format (a DoRA magnitude, a bias delta
// ".diff_b", a full-weight ".diff", anything else).
std::optional<LoraKey> parse_lora_key(const std::string& key);

// "a.b.c" -> "a_b_c".
std::string underscored(const std::string& dotted);

}  // namespace tprun::lora
