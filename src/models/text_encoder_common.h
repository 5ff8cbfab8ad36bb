#pragma once
// What the text encoders share: activations by transformers' name and the
// checks of input_ids.

#include <cstdint>
#include <string>

namespace at {
class Tensor;
}

namespace tprun::models {

// transformers' ACT2FN by name: quick_gelu, gelu (erf), gelu_new (tanh
// approximation, computed as NewGELUActivation), gelu_pytorch_tanh, relu,
// silu / swish. `known_activation` tells whether a name is supported.
bool known_activation(const std::string& name);
at::Tensor hf_activation(const at::Tensor& x, const std::string& name);

// input_ids checks shared by the text encoders: an integer tensor [B, S] with
// B, S >= 1 and every id in [0, vocab_size); returns it as int64. RequestError
// naming `model` (all_ranks: raised alike on every rank given the same ids).
at::Tensor checked_input_ids(const at::Tensor& input_ids, int64_t vocab_size, const std::string& model,
                             bool all_ranks);

// attention_mask [B, S] of 0/1 (any integer, bool or floating type) matching
// `ids` -> bool on ids' device; all true when undefined. RequestError naming
// `model`, raised alike on every rank given the same mask.
at::Tensor attention_keep_mask(const at::Tensor& mask, const at::Tensor& ids, const std::string& model);

}  // namespace tprun::models
