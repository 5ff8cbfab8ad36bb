#include "pipelines/request_checks.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <c10/core/ScalarType.h>

#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::pipelines {

void need_given_shape(const GenerationRequest& r, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& meaning) {
  if (!r.has_given(name)) return;
  const auto got = r.given->at(name).sizes().vec();
  bool ok = got.size() == shape.size();
  // -1: any size but 0 (a text of no tokens, an empty batch are never inputs).
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 ? got[i] > 0 : got[i] == shape[i];
  if (!ok) {
    std::vector<std::string> want;
    for (int64_t s : shape) want.push_back(s < 0 ? std::string("*") : std::to_string(s));
    throw RequestError(fmt::format("given tensor '{}' has shape [{}]; expected [{}] ({}; * is any size from 1)", name,
                                   fmt::join(got, ", "), fmt::join(want, ", "), meaning),
                       true);
  }
}

void check_given_inputs(const models::TensorMap& tensors, const std::string& source) {
  for (const auto& [name, t] : tensors) {
    const auto shape = t.sizes().vec();
    if (t.numel() == 0) {
      throw ConfigError(fmt::format("{}: tensor '{}' has the shape [{}]: no elements{}; give at least one", source,
                                    name, fmt::join(shape, ", "),
                                    name.find("embeds") != std::string::npos ? " (no text tokens)" : ""),
                        true);
    }
    const bool embedding = name.size() >= 6 && name.compare(name.size() - 6, 6, "embeds") == 0;
    if ((embedding || name == "latents") && !at::isFloatingType(t.scalar_type())) {
      throw ConfigError(fmt::format("{}: tensor '{}' is {}, not floating point; it would be converted to the compute "
                                    "dtype as numbers it does not hold",
                                    source, name, c10::toString(t.scalar_type())),
                        true);
    }
  }
}

void need_text_prompts(const GenerationRequest& r) {
  auto check = [](const std::string& text, const char* field) {
    const size_t nul = text.find('\0');
    if (nul != std::string::npos) {
      throw RequestError(fmt::format("{} holds a NUL character (at byte {}); PNG text metadata cannot carry it, so "
                                     "the prompt is refused rather than stored cut short",
                                     field, nul),
                         true);
    }
    text::decode_utf8(text, field);  // RequestError naming the byte offset in this text
  };
  check(r.prompt, "prompt");
  if (r.negative_prompt) check(*r.negative_prompt, "negative_prompt");
}

}  // namespace tprun::pipelines
