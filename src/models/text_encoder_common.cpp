// The pieces the text encoders share: activations by transformers' name and
// the input_ids checks.
#include "models/text_encoder_common.h"

#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tanh.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"

namespace tprun::models {

bool known_activation(const std::string& n) {
  return n == "quick_gelu" || n == "gelu" || n == "gelu_new" || n == "gelu_pytorch_tanh" || n == "relu" ||
         n == "silu" || n == "swish";
}

at::Tensor hf_activation(const at::Tensor& x, const std::string& name) {
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);  // QuickGELUActivation
  if (name == "gelu") return at::gelu(x);                          // erf form
  if (name == "gelu_new") {                                        // NewGELUActivation, as written there
    return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
  }
  if (name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  if (name == "silu" || name == "swish") return at::silu(x);
  throw ConfigError(fmt::format("activation '{}' is not supported (known: quick_gelu, gelu, gelu_new, "
                                "gelu_pytorch_tanh, relu, silu)",
                                name));
}

at::Tensor checked_input_ids(const at::Tensor& ids, int64_t vocab_size, const std::string& model, bool all_ranks) {
  if (!ids.defined()) throw RequestError(fmt::format("{}: input_ids is missing", model), all_ranks);
  if (ids.dim() != 2) {
    throw RequestError(fmt::format("{}: input_ids must have 2 dims [batch, sequence], got {}", model, ids.dim()),
                       all_ranks);
  }
  if (!c10::isIntegralType(ids.scalar_type(), /*includeBool=*/false)) {
    throw RequestError(fmt::format("{}: input_ids must be an integer tensor, got {}", model,
                                   c10::toString(ids.scalar_type())),
                       all_ranks);
  }
  if (ids.size(0) < 1 || ids.size(1) < 1) {
    throw RequestError(fmt::format("{}: input_ids is empty ([{}, {}])", model, ids.size(0), ids.size(1)), all_ranks);
  }
  at::Tensor l = ids.to(at::kLong);
  const int64_t lo = l.min().item<int64_t>(), hi = l.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size) {
    throw RequestError(fmt::format("{}: input id {} is outside the vocabulary [0, {})", model, lo < 0 ? lo : hi,
                                   vocab_size),
                       all_ranks);
  }
  return l;
}

at::Tensor attention_keep_mask(const at::Tensor& mask, const at::Tensor& ids, const std::string& model) {
  if (!mask.defined()) return at::ones(ids.sizes(), ids.options().dtype(at::kBool));
  if (mask.dim() != 2 || mask.size(0) != ids.size(0) || mask.size(1) != ids.size(1)) {
    throw RequestError(fmt::format("{}: attention_mask has shape [{}] but input_ids is [{}, {}]", model,
                                   fmt::join(mask.sizes(), ", "), ids.size(0), ids.size(1)),
                       true);
  }
  if (at::isComplexType(mask.scalar_type())) {
    throw RequestError(fmt::format("{}: attention_mask must be 0/1 integers", model), true);
  }
  const at::Tensor m = mask.to(ids.device());
  if (!m.eq(0).logical_or(m.eq(1)).all().item<bool>()) {
    throw RequestError(fmt::format("{}: attention_mask must hold only 0 and 1", model), true);
  }
  return m.ne(0);
}

}  // namespace tprun::models
