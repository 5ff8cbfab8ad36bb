#pragma once
// QwenImagePipeline's text conditioning between the encoder and the
// transformer:
//   qwen_image_keep_tokens  one prompt's encoder output [1, S, D] -> the rows
//                           the transformer sees: the template's first 34
//                           dropped, then at most max_sequence_length
//   pad_text_batch          a batch's embeddings (each [1, S_i, D], with its
//                           mask [1, S_i] or none = all real) -> [B, S_max, D]
//                           zero-padded and the mask [B, S_max] (int64, 1 =
//                           real token); the mask is left undefined when every
//                           entry is 1, as diffusers passes None then.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tprun::pipelines {

// RequestError when the encoder output holds no more than the dropped tokens
// (a template whose prompt part was cut away entirely).
at::Tensor qwen_image_keep_tokens(const at::Tensor& hidden, int64_t drop, int64_t max_sequence_length);

struct TextBatch {
  at::Tensor embeds;  // [B, S_max, D]
  at::Tensor mask;    // [B, S_max] int64, or undefined when all ones
};

// `masks[i]` undefined: all ones. RequestError naming `what` when the widths
// (D) differ or a mask does not match its embeddings' length.
TextBatch pad_text_batch(const std::vector<at::Tensor>& embeds, const std::vector<at::Tensor>& masks,
                         const char* what);

}  // namespace tprun::pipelines
