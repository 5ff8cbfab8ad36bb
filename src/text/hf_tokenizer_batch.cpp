// Padding a batch to its longest row (see hf_tokenizer_batch.h). Each text
// goes through HfTokenizer::encode_padded at max_length, which truncates and
// pads on the tokenizer's sides; the rows are then cut back to the longest
// real length: a row padded on the left keeps its last `length` entries, one
// padded on the right its first. Rows that were not padded are already
// max_length = the batch length long.

#include "text/hf_tokenizer_batch.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::text {

namespace {
constexpr int64_t kMaxBatchLength = int64_t{1} << 21;  // > the ids of a 1 MiB text
}

TokenizerBatch encode_batch_longest(const HfTokenizer& tokenizer, const std::vector<std::string>& texts,
                                    int64_t max_length, bool add_special_tokens) {
  if (texts.empty()) throw RequestError(fmt::format("tokenizer {}: an empty batch of texts", tokenizer.folder()));
  if (max_length < 1 || max_length > kMaxBatchLength)
    throw RequestError(fmt::format("tokenizer {}: max_length {} is outside [1, {}]", tokenizer.folder(), max_length,
                                   kMaxBatchLength));
  std::vector<TokenizerOutput> rows;
  rows.reserve(texts.size());
  TokenizerBatch batch;
  for (const auto& text : texts) {
    rows.push_back(tokenizer.encode_padded(text, max_length, add_special_tokens));
    const auto& mask = rows.back().attention_mask;
    batch.length = std::max<int64_t>(batch.length, std::count(mask.begin(), mask.end(), int64_t{1}));
    batch.untruncated_lengths.push_back(rows.back().untruncated_length);
  }
  const auto keep = static_cast<std::ptrdiff_t>(batch.length);
  for (auto& row : rows) {
    const bool padded_left = !row.attention_mask.empty() && row.attention_mask.front() == 0;
    auto cut = [&](std::vector<int64_t>& v) {
      return padded_left ? std::vector<int64_t>(v.end() - keep, v.end()) : std::vector<int64_t>(v.begin(), v.begin() + keep);
    };
    batch.input_ids.push_back(cut(row.input_ids));
    batch.attention_mask.push_back(cut(row.attention_mask));
  }
  return batch;
}

}  // namespace tprun::text
