// QwenImagePipeline's text conditioning (see qwen_image_text.h).
#include "pipelines/qwen_image_text.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::pipelines {

at::Tensor qwen_image_keep_tokens(const at::Tensor& hidden, int64_t drop, int64_t max_sequence_length) {
  const int64_t s = hidden.size(1);
  if (s <= drop) {
    throw RequestError(fmt::format("the prompt template gave {} tokens, no more than the {} the pipeline drops", s,
                                   drop),
                       true);
  }
  const int64_t end = std::min(s, drop + max_sequence_length);
  return hidden.slice(1, drop, end).contiguous();
}

TextBatch pad_text_batch(const std::vector<at::Tensor>& embeds, const std::vector<at::Tensor>& masks,
                         const char* what) {
  if (embeds.empty() || embeds.size() != masks.size()) {
    throw std::logic_error(fmt::format("pad_text_batch: {} embeddings and {} masks", embeds.size(), masks.size()));
  }
  int64_t longest = 0;
  for (size_t i = 0; i < embeds.size(); ++i) {
    const at::Tensor& e = embeds[i];
    if (e.dim() != 3 || e.size(0) != 1 || e.size(2) != embeds[0].size(2)) {
      throw RequestError(fmt::format("the {} of a batch differ in shape", what), true);
    }
    if (masks[i].defined() && (masks[i].dim() != 2 || masks[i].size(0) != 1 || masks[i].size(1) != e.size(1))) {
      throw RequestError(fmt::format("the {} mask [1, {}] does not match its embeddings [1, {}, {}]", what,
                                     masks[i].dim() == 2 ? masks[i].size(1) : -1, e.size(1), e.size(2)),
                         true);
    }
    longest = std::max(longest, e.size(1));
  }
  std::vector<at::Tensor> padded, padded_masks;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(embeds[0].device());
  for (size_t i = 0; i < embeds.size(); ++i) {
    const at::Tensor& e = embeds[i];
    const int64_t s = e.size(1), pad = longest - s;
    at::Tensor m = masks[i].defined() ? masks[i].to(long_opts) : at::ones({1, s}, long_opts);
    if (pad > 0) {
      padded.push_back(at::cat({e, at::zeros({1, pad, e.size(2)}, e.options())}, 1));
      padded_masks.push_back(at::cat({m, at::zeros({1, pad}, long_opts)}, 1));
    } else {
      padded.push_back(e);
      padded_masks.push_back(m);
    }
  }
  TextBatch b;
  b.embeds = padded.size() == 1 ? padded[0] : at::cat(padded, 0);
  at::Tensor mask = padded_masks.size() == 1 ? padded_masks[0] : at::cat(padded_masks, 0);
  if (!mask.ne(0).all().item<bool>()) b.mask = mask;
  return b;
}

}  // namespace tprun::pipelines
