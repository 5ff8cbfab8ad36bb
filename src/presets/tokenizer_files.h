#pragma once
// Tokenizer folders that tprun makes itself (`tprun init-model`), in FLUX.1's
// layout, learned from a text corpus:
//  - tokenizer/   CLIP byte-level BPE (bpe_trainer.h): vocab.json, merges.txt,
//                 tokenizer_config.json, special_tokens_map.json; bos
//                 <|startoftext|>, eos = pad = unk <|endoftext|>.
//  - tokenizer_2/ T5 SentencePiece unigram (libsentencepiece's trainer,
//                 nmt_nfkc, <pad>=0 </s>=1 <unk>=2, no <s>): spiece.model,
//                 tokenizer.json (the fast tokenizer transformers 5 loads when
//                 the sentencepiece Python package is absent, as FLUX.1 ships
//                 it), tokenizer_config.json (legacy, extra_ids),
//                 special_tokens_map.json; <extra_id_0> is the last id.
// Every file is written atomically; existing files are not overwritten.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "text/bpe_trainer.h"

namespace tprun::presets {

// The bundled English corpus (image-prompt-like sentences, one per entry),
// defined in bundled_corpus.cpp.
const std::vector<std::string>& bundled_corpus();

// Writes the CLIP tokenizer files for `vocab` into `dir` (created if
// missing). Returns the vocabulary size (vocab.tokens.size()).
int64_t write_clip_tokenizer(const std::string& dir, const text::BpeVocabulary& vocab, int64_t model_max_length = 77);

// A SentencePiece unigram model trained for T5.
struct T5Vocabulary {
  std::string model_proto;                         // spiece.model's bytes
  std::vector<std::pair<std::string, float>> pieces;  // by id
  std::string precompiled_charsmap;                // the nmt_nfkc normaliser's table
};

// Trains a unigram model of at most `vocab_size` pieces (fewer when the text
// supports fewer) on `texts`, single-threaded (same text, same model). The
// piece scores are rounded to multiples of 2^-10, so SentencePiece (float
// sums over the whole text) and the tokenizers library (double sums per
// word) add them exactly and choose the same pieces.
// `byte_fallback`: SentencePiece's byte_fallback (the 256 <0xNN> pieces after
// <unk>, as UMT5's model has them). Throws ConfigError when sentencepiece
// rejects the settings or the text.
T5Vocabulary train_t5_sentencepiece(const std::vector<std::string>& texts, int vocab_size, bool byte_fallback = false);

// Writes the T5 tokenizer files into `dir` (created if missing). Returns the
// tokenizer length: pieces + extra_ids. `byte_fallback`: tokenizer.json's
// model.byte_fallback (true for a model trained with it, as a conversion of
// UMT5's spiece.model writes it; transformers 5's T5Tokenizer ignores it).
int64_t write_t5_tokenizer(const std::string& dir, const T5Vocabulary& vocab, int extra_ids = 100,
                           int64_t model_max_length = 512, bool byte_fallback = false);

// The precompiled_charsmap of a serialized SentencePiece ModelProto
// (normalizer_spec field); empty when it has none. CheckpointError naming
// `what` for malformed bytes.
std::string spm_precompiled_charsmap(const std::string& model_proto, const std::string& what);

// Standard base64 (RFC 4648, with padding).
std::string base64_encode(const std::string& bytes);

}  // namespace tprun::presets
