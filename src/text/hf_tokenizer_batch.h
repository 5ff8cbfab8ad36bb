#pragma once
// A batch of texts through an HfTokenizer the way transformers pads a batch
// to its longest member: tokenizer(texts, max_length=max_length,
// padding=True, truncation=True) (QwenImagePipeline's prompt encoding).
//
// Each text is tokenized alone (special tokens of the post-processor when
// add_special_tokens), truncated to max_length ids on the tokenizer's
// truncation side (the special tokens kept, the content cut), then every row
// is padded with the pad token on the tokenizer's padding side up to the
// longest row of the batch (not up to max_length). The attention mask is 1 on
// a row's own ids and 0 on its padding.

#include <cstdint>
#include <string>
#include <vector>

#include "text/hf_tokenizer.h"

namespace tprun::text {

struct TokenizerBatch {
  std::vector<std::vector<int64_t>> input_ids;       // one row per text, each `length` ids
  std::vector<std::vector<int64_t>> attention_mask;  // same shape; 0 on padding
  int64_t length = 0;                                // the longest row after truncation
  std::vector<int64_t> untruncated_lengths;          // per text: ids with special tokens before truncation
};

// RequestError for an empty batch, max_length < 1 or above 2^21, fewer ids
// than the special tokens added, no pad token, or a text encode() refuses.
TokenizerBatch encode_batch_longest(const HfTokenizer& tokenizer, const std::vector<std::string>& texts,
                                    int64_t max_length, bool add_special_tokens = true);

}  // namespace tprun::text
