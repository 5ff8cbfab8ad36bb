#pragma once
// The tokenizers library's Unigram model and SentencePiece "Precompiled"
// normalizer, as transformers 5's T5Tokenizer builds them (t5_unigram_tokenizer.h):
//
//  - SpmPrecompiled: a SentencePiece precompiled_charsmap (a darts double-array
//    trie over UTF-8 bytes + a blob of NUL-terminated replacements), applied as
//    tokenizers' `Precompiled` normalizer does it: text is cut into extended
//    grapheme clusters (ICU); a cluster under 6 bytes is looked up whole and,
//    when the trie has some prefix of it, replaced by the replacement of the
//    SHORTEST such prefix (the library's own choice, kept for exactness);
//    otherwise each code point is looked up alone and replaced or kept.
//  - UnigramModel: Viterbi over the pieces (scores added in double, a later
//    candidate wins only with a strictly higher score), a code point no piece
//    starts with costs min(score) - 10 as unk, and consecutive unknowns fuse
//    into one unk (tokenizers' encode_optimized with fuse_unk; byte_fallback
//    off, as T5Tokenizer sets it, so an unknown character is never bytes).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tprun::text {

class SpmPrecompiled {
 public:
  SpmPrecompiled() = default;
  // `charsmap`: the raw bytes ([u32 trie bytes][trie][replacements]).
  // CheckpointError naming `what` when malformed (sizes, replacements that
  // are not UTF-8); a trie entry pointing outside the trie or the
  // replacements matches nothing.
  SpmPrecompiled(std::string charsmap, const std::string& what);
  bool empty() const { return trie_.empty(); }
  // The normalized text of valid UTF-8 `text`.
  std::string normalize(const std::string& text) const;

 private:
  // The replacement of the shortest prefix of `chunk` the trie holds, or false.
  bool transform(std::string_view chunk, std::string_view& out) const;

  std::vector<uint32_t> trie_;
  std::string replacements_;
};

class UnigramModel {
 public:
  UnigramModel() = default;
  // `vocab`: (piece, score) by id; `unk_id` indexes it. CheckpointError naming
  // `what` for an empty vocabulary, an empty or duplicate piece, a non-finite
  // score or an unk_id outside it.
  UnigramModel(std::vector<std::pair<std::string, double>> vocab, int64_t unk_id, const std::string& what);

  // The ids of one pre-token (valid UTF-8), appended to `ids`.
  void encode(std::string_view text, std::vector<int64_t>& ids) const;
  // The id of `piece`, or -1.
  int64_t id_of(std::string_view piece) const;
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::string& piece(int64_t id) const { return vocab_[static_cast<size_t>(id)].first; }

 private:
  std::vector<std::pair<std::string, double>> vocab_;
  std::vector<int32_t> sorted_;  // ids sorted by piece (bytewise), for prefix searches
  int64_t unk_id_ = 0;
  double unk_score_ = 0;
};

}  // namespace tprun::text
