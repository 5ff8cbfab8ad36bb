#include "models/model_inputs.h"

#include <algorithm>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/model.h"
#include "runtime/error.h"

namespace tprun::models {

at::Tensor input(const TensorMap& in, const std::string& name, int64_t dims) {
  auto it = in.find(name);
  if (it == in.end() || !it->second.defined()) throw RequestError(fmt::format("input '{}' is missing", name), true);
  if (dims >= 0 && it->second.dim() != dims) {
    throw RequestError(fmt::format("input '{}' must have {} dims, got {}", name, dims, it->second.dim()), true);
  }
  return it->second;
}

bool has_input(const TensorMap& in, const std::string& name) {
  auto it = in.find(name);
  return it != in.end() && it->second.defined();
}

void check_guidance_input(const TensorMap& in, bool guidance_embeds) {
  const bool given = has_input(in, "guidance");
  if (guidance_embeds && !given) throw RequestError("this model has guidance_embeds: input 'guidance' is required", true);
  if (!guidance_embeds && given) throw RequestError("this model has no guidance embedder: drop input 'guidance'", true);
}

at::Tensor sequence_input(const TensorMap& in, const std::string& name, int64_t features, const char* field) {
  at::Tensor t = input(in, name, 3);
  if (t.size(2) != features) {
    throw RequestError(fmt::format("input '{}' has {} features per token but {} is {}", name, t.size(2), field,
                                   features),
                       true);
  }
  return t;
}

at::Tensor ids_input(const TensorMap& in, const std::string& name, int64_t tokens, size_t axes) {
  const at::Tensor given = input(in, name, -1);
  at::Tensor ids = given.dim() == 3 ? given[0] : given;
  if (ids.dim() != 2 || ids.size(0) != tokens || ids.size(1) < static_cast<int64_t>(axes)) {
    throw RequestError(fmt::format("input '{}' must be [{}, >= {}] (one row of position ids per token, a column per "
                                   "RoPE axis), got [{}]",
                                   name, tokens, axes, fmt::join(given.sizes(), ", ")),
                       true);
  }
  return ids;
}

at::Tensor scalar_per_sample(const TensorMap& in, const std::string& name, int64_t batch) {
  at::Tensor t = input(in, name, -1).reshape({-1});
  if (t.numel() != batch && t.numel() != 1) {
    throw RequestError(fmt::format("input '{}' has {} values for a batch of {}", name, t.numel(), batch), true);
  }
  return t;
}

std::vector<std::string> forward_input_names(const Model& model) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : model.example_inputs(0)) names.push_back(name);
  const auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  if (has("latents") || has("image")) {
    for (const char* n : {"latents", "image"}) {
      if (!has(n)) names.emplace_back(n);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

void check_input_names(const TensorMap& given, const Model& model, const std::string& source) {
  const std::vector<std::string> known = forward_input_names(model);
  for (const auto& [name, tensor] : given) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw RequestError(fmt::format("{}: tensor '{}' is not an input of {} (its inputs: {}); rename or drop it",
                                     source, name, model.table().cls, fmt::join(known, ", ")),
                         true);
    }
  }
}

}  // namespace tprun::models
