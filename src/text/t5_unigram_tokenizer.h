#pragma once
// T5's tokenizer as transformers 5 builds it from a folder with tokenizer.json
// (Wan's tokenizer/: UMT5's 256,000 SentencePiece pieces + 300 <extra_id_N>,
// class T5TokenizerFast / T5Tokenizer). transformers 5.17 reads tokenizer.json
// FIRST (spiece.model is not read when tokenizer.json is there) and, because
// T5Tokenizer has its own __init__, takes from it only the vocabulary (pieces
// and scores) and the Precompiled normalizer's charsmap, then rebuilds:
//   added tokens (tokenizer_config.json's added_tokens_decoder, eos / unk /
//   pad, additional_special_tokens) split out of the raw text first;
//   normalizer   Precompiled(charsmap) only (the file's other normalizers,
//                e.g. a Replace of space runs, are dropped; none without one);
//   pre-tokenizer WhitespaceSplit (Unicode White_Space), then
//                Metaspace("▁", prepend_scheme="always", split=true);
//   model        Unigram(vocab, unk_id=2, byte_fallback=False): a character
//                no piece covers is <unk> (consecutive ones fused into one
//                <unk>), never byte pieces, whatever the file's byte_fallback
//                says; "<0x41>"-like byte pieces are ordinary pieces;
//   post-processor "$A </s>": eos always appended (even after a literal
//                "</s>"), truncation to max_length - 1 content ids first.
// Added tokens are matched in the raw text (their "normalized" flag is not
// applied: the hub's are all normalized=false). A folder with spiece.model
// alone is refused by name (transformers would convert it with the
// sentencepiece package, which tprun does not emulate here).

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer_common.h"
#include "text/unigram.h"

namespace tprun::text {

class T5UnigramTokenizer {
 public:
  // Reads dir/tokenizer.json (at most 64 MiB), tokenizer_config.json and
  // special_tokens_map.json. CheckpointError naming the file and the field
  // for anything missing, malformed or hostile (vocabulary above 2^22 pieces,
  // a piece above 4096 bytes, an added token whose id is not the one
  // transformers would give it, a special token neither in the vocabulary
  // nor added).
  explicit T5UnigramTokenizer(const std::string& dir);

  // tokenizer(prompt, padding="max_length", max_length, truncation=True,
  // add_special_tokens=True): content ids truncated to max_length - 1, eos,
  // pad ids to max_length; the mask 1 up to and including eos. RequestError
  // for invalid UTF-8 or max_length below 1.
  TokenizerOutput encode(const std::string& prompt, int64_t max_length) const;
  // The content ids of a prompt: no eos, no truncation, no padding.
  std::vector<int64_t> content_ids(const std::string& prompt) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  // The vocabulary plus added tokens past it (len(tokenizer)).
  int64_t vocab_size() const { return vocab_size_; }

 private:
  void encode_text(const std::string& text, std::vector<int64_t>& ids) const;

  std::string dir_;
  UnigramModel model_;
  SpmPrecompiled normalizer_;
  std::vector<AddedToken> added_;
  AddedTokenTrie added_trie_;
  int64_t eos_id_ = 1, pad_id_ = 0, unk_id_ = 2, vocab_size_ = 0;
};

}  // namespace tprun::text
