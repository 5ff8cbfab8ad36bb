#pragma once
// One LoRA adapter a request runs with: a .safetensors file and its weight.
// The readers (a manifest, a requests file, `generate`'s flags) resolve the
// path and check the scale before it lands here. Torch-free.

#include <cstddef>
#include <string>
#include <vector>

namespace tprun::lora {

struct LoraChoice {
  std::string path;    // the file, as resolved by the reader (relative to the manifest's folder made absolute)
  double scale = 1.0;  // the adapter's weight (diffusers' set_adapters adapter_weights)
  bool operator==(const LoraChoice& other) const { return path == other.path && scale == other.scale; }
  bool operator!=(const LoraChoice& other) const { return !(*this == other); }
};

// Bounds of the adapter lists every reader applies.
constexpr size_t kMaxLorasPerRequest = 64;  // adapters stacked in one request
constexpr double kMaxLoraScale = 1000.0;    // |scale|

// The identity of an adapter set as batches and the job runner compare it:
// every adapter's path and scale, in order. Requests with equal keys run with
// the same adapters; "" is the base model.
std::string lora_set_key(const std::vector<LoraChoice>& set);

}  // namespace tprun::lora
