#pragma once
// A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json,
// special_tokens_map.json, chat templates) tokenized the way transformers 5
// and the tokenizers library do it, for the FLUX.2 text encoders (Qwen3 for
// klein, Mistral-Small-3.x for dev).
//
// Pipeline of one text (tokenizers' Tokenizer::encode):
//  1. added tokens (tokenizer.json "added_tokens" and tokenizer_config.json
//     "added_tokens_decoder", plus the named special tokens) are found first,
//     leftmost-longest, with tries built at load (added_token_trie.h);
//     lstrip/rstrip swallow the whitespace next to them,
//     single_word ones match only between non-word characters; tokens with
//     normalized=false are matched on the raw text, the others on the
//     normalized pieces between those; split_special_tokens=true turns the
//     special ones off;
//  2. the normalizer (NFC, NFD, NFKC, NFKD, Sequence) on the other pieces;
//  3. the pre-tokenizer (Split with a regex (hf_regex.h), behavior Isolated;
//     ByteLevel with add_prefix_space and use_regex; Sequence);
//  4. the BPE model (hf_bpe.h) on each piece;
//  5. the post-processor (ByteLevel adds nothing; TemplateProcessing adds its
//     special tokens when add_special_tokens; Sequence) - tokenizer.json's,
//     as transformers 5 keeps it when tokenizer.json exists (add_bos_token /
//     add_eos_token of tokenizer_config.json are then ignored);
//  6. truncation to max_length (minus the special tokens the post-processor
//     adds) on the tokenizer's truncation side, then padding to max_length
//     with pad_token on its padding side (tokenizer_config.json padding_side /
//     truncation_side, else tokenizer.json's padding / truncation direction,
//     else right).
//
// The class transformers builds matters: Qwen2Tokenizer (what Flux2Klein's
// model_index.json names) rebuilds normalizer, pre-tokenizer and BPE options
// in Python and reads only vocab, merges and post-processor from
// tokenizer.json; tprun then requires tokenizer.json to hold exactly that
// pipeline. TokenizersBackend / PreTrainedTokenizerFast (and a missing
// tokenizer_class) use tokenizer.json as it is; so does PixtralProcessor
// (named by model_index.json, or by processor_config.json for AutoProcessor),
// which transformers loads as TokenizersBackend whatever tokenizer_class says
// (the hub's Mistral-Small-3.1 files say LlamaTokenizerFast). Any other class, and anything
// in tokenizer.json outside the list above, is a CheckpointError naming the
// file and field: never a silently different tokenization.
//
// Hostile files: tokenizer.json is refused above 64 MiB before it is read;
// vocabulary, merges and added tokens above 2^22 / 2^22 / 2^20 entries, tokens
// above 4096 bytes, ids at or above 2^31 and nesting lists above 64 entries
// are refused by name before tprun builds anything from them
// (HfTokenizerLimits in hf_bpe.h). A prompt above 1 MiB is a RequestError.
//
// An HfTokenizer is immutable after load; encode* may be called from several
// threads.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/tokenizer_common.h"

namespace tprun::text {

class HfTokenizer {
 public:
  // Loads `folder`. `transformers_class` is the class the pipeline's
  // model_index.json names for it ("Qwen2TokenizerFast", "PixtralProcessor",
  // ...); empty means AutoTokenizer, i.e. tokenizer_config.json's
  // tokenizer_class (a processor loads its tokenizer that way too).
  // CheckpointError naming file and field for anything missing, malformed,
  // too large or not implemented.
  static HfTokenizer load(const std::string& folder, const std::string& transformers_class = "");

  // tokenizer(text, add_special_tokens=...)["input_ids"]: no truncation, no
  // padding. RequestError for invalid UTF-8.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;

  // tokenizer(text, padding="max_length", truncation=True,
  // max_length=max_length, add_special_tokens=...): exactly max_length ids and
  // the attention mask (0 on padding). RequestError for max_length < 1, fewer
  // than the special tokens the post-processor adds, or no pad token.
  TokenizerOutput encode_padded(const std::string& text, int64_t max_length, bool add_special_tokens = true) const;

  // The template text the request's caller uses, rendered (chat_template.h).
  // CheckpointError "chat template of <file> is not one tprun knows ..." or
  // "<folder>: no chat template for ...".
  std::string apply_chat_template(const ChatRequest& request) const;

  // The pipelines' prompt -> ids: apply_chat_template, then encode_padded
  // with add_special_tokens as the request's caller does (ChatCaller).
  TokenizerOutput encode_chat(const ChatRequest& request, int64_t max_length) const;

  // The recognised template the caller would use; throws as
  // apply_chat_template does. A pipeline calls this at load to fail early.
  ChatTemplateKind chat_template(ChatCaller caller) const;

  // Largest id the tokenizer can produce + 1 (model vocabulary and added
  // tokens): the text encoder's vocab_size must be at least this.
  int64_t vocab_size() const;

  // What a pipeline checks at load, before any weight (CheckpointError, every
  // rank): a pad token, since every prompt call pads (diffusers' tokenizer
  // call raises on every request without one), naming tokenizer_config.json's
  // pad_token; and every id below the text encoder's `encoder_vocab_size`,
  // naming each token beyond it and where it was named (a pad_token or
  // eos_token the vocabulary does not have is added by transformers as a new
  // token, past the vocabulary).
  void require_pad_token(const std::string& pipeline) const;
  void check_ids_below(int64_t encoder_vocab_size, const std::string& encoder_config) const;

  // The id of a token (added tokens first, then the model vocabulary).
  std::optional<int64_t> token_id(const std::string& token) const;

  std::optional<std::string> bos_token() const;
  std::optional<std::string> pad_token() const;
  const std::string& folder() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tprun::text
