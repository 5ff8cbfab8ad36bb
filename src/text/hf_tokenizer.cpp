// Encoding with a loaded tokenizer folder (see hf_tokenizer.h for the steps).

#include "text/hf_tokenizer.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include "text/byte_level.h"
#include "text/hf_tokenizer_impl.h"
#include "runtime/error.h"

namespace tprun::text {

namespace {

constexpr size_t kMaxTextBytes = size_t{1} << 20;  // one prompt / rendered chat

struct Piece {
  std::string text;
  int64_t id = -1;  // an added token's id; -1 for text still to tokenize
};

// Rust regex's \s (White_Space) and \w (Alphabetic, M, Nd, Pc, Join_Control),
// which tokenizers uses around added tokens.
bool rust_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }
bool rust_word(char32_t c) {
  const auto ch = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(ch, UCHAR_ALPHABETIC) || u_hasBinaryProperty(ch, UCHAR_JOIN_CONTROL)) return true;
  return (U_GET_GC_MASK(ch) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

// The code point that ends / starts at a byte offset of valid UTF-8.
char32_t last_char(const std::string& s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return decode_utf8(s.substr(b, end - b), "text")[0];
}
size_t char_len_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
}
char32_t char_at(const std::string& s, size_t i) { return decode_utf8(s.substr(i, char_len_at(s, i)), "text")[0]; }

// tokenizers' AddedVocabulary::find_matches (leftmost-longest, then
// single_word / lstrip / rstrip) splitting one piece of text; `trie` indexes
// `added`.
void split_on(const std::string& s, const AddedTokenTrie& trie, const std::vector<HfAddedToken>& added,
              bool skip_special, std::vector<Piece>& out) {
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const auto match = trie.find(s, pos);
    if (!match) break;
    const HfAddedToken* token = &added[static_cast<size_t>(match->index)];
    size_t start = match->begin, stop = match->end;
    pos = stop;
    if (skip_special && token->special) continue;
    if (token->single_word) {
      const bool start_space = start == 0 || !rust_word(last_char(s, start));
      const bool stop_space = stop == s.size() || !rust_word(char_at(s, stop));
      if (!start_space || !stop_space) continue;
    }
    if (token->lstrip) {
      size_t b = start;
      while (b > 0 && rust_space(last_char(s, b))) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (token->rstrip)
      while (stop < s.size() && rust_space(char_at(s, stop))) stop += char_len_at(s, stop);
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({s.substr(start, stop - start), token->id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
}

}  // namespace

std::string normalize_text(const std::vector<HfNormalizerKind>& normalizers, const std::string& text) {
  std::string cur = text;
  for (auto kind : normalizers) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = nullptr;
    switch (kind) {
      case HfNormalizerKind::kNFC: n = icu::Normalizer2::getNFCInstance(status); break;
      case HfNormalizerKind::kNFD: n = icu::Normalizer2::getNFDInstance(status); break;
      case HfNormalizerKind::kNFKC: n = icu::Normalizer2::getNFKCInstance(status); break;
      case HfNormalizerKind::kNFKD: n = icu::Normalizer2::getNFKDInstance(status); break;
    }
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    if (U_SUCCESS(status)) n->normalizeUTF8(0, icu::StringPiece(cur.data(), static_cast<int32_t>(cur.size())), sink, nullptr, status);
    if (U_FAILURE(status)) throw RequestError(fmt::format("Unicode normalization failed: {}", u_errorName(status)));
    cur = std::move(out);
  }
  return cur;
}

namespace {

void split_isolated(const std::string& text, const SplitRegex& regex, std::vector<Piece>& out) {
  const std::u32string u = decode_utf8(text, "text");
  size_t prev = 0;
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back({encode_utf8(u.substr(b, e - b)), -1});
  };
  std::vector<std::pair<size_t, size_t>> matches;
  try {
    matches = regex.find_all(u);
  } catch (const std::runtime_error& e) {
    throw RequestError(e.what());
  }
  for (const auto& [b, e] : matches) {
    emit(prev, b);
    emit(b, e);
    prev = e;
  }
  emit(prev, u.size());
}

// Steps 1-2: added tokens on the raw text, the normalizer, added tokens on the normalized pieces.
std::vector<Piece> split_added_and_normalize(const HfTokenizer::Impl& impl, const std::string& text) {
  std::vector<Piece> pieces, out;
  split_on(text, impl.raw_added_trie, impl.added, impl.split_special_tokens, pieces);
  for (auto& p : pieces) {
    if (p.id >= 0) out.push_back(std::move(p));
    else split_on(normalize_text(impl.normalizers, p.text), impl.normalized_added_trie, impl.added, impl.split_special_tokens, out);
  }
  return out;
}

// ByteLevel: the optional prefix space, the optional GPT-2 split, each byte as its symbol.
void byte_level(const HfPreTokenizerStep& step, const std::string& text, std::vector<Piece>& out) {
  const auto& byte_symbol = byte_level_symbols();
  std::string s = text;
  if (step.add_prefix_space && (s.empty() || s[0] != ' ')) s.insert(s.begin(), ' ');
  std::vector<Piece> parts;
  if (step.regex) split_isolated(s, *step.regex, parts);
  else parts.push_back({s, -1});
  for (auto& part : parts) {
    std::string mapped;
    for (unsigned char c : part.text) mapped += byte_symbol[c];
    out.push_back({std::move(mapped), -1});
  }
}

// Step 3: the pre-tokenizers in order, on the pieces that are not added tokens.
std::vector<Piece> pre_tokenize(const HfTokenizer::Impl& impl, std::vector<Piece> pieces) {
  std::vector<Piece> next;
  for (const auto& step : impl.pre_tokenizers) {
    next.clear();
    for (auto& p : pieces) {
      if (p.id >= 0) next.push_back(std::move(p));
      else if (step.kind == HfPreTokenizerStep::Kind::kSplit) split_isolated(p.text, *step.regex, next);
      else byte_level(step, p.text, next);
    }
    pieces.swap(next);
  }
  return pieces;
}

// Step 5: the post-processor's templates around `ids`.
std::vector<int64_t> post_process(const HfTokenizer::Impl& impl, std::vector<int64_t> ids) {
  for (const auto& step : impl.post_processor) {
    std::vector<int64_t> out;
    for (const auto& item : step.items) {
      if (item.sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
    ids.swap(out);
  }
  return ids;
}

}  // namespace

HfTokenizer HfTokenizer::load(const std::string& folder, const std::string& transformers_class) {
  HfTokenizer t;
  t.impl_ = load_hf_tokenizer(folder, transformers_class);
  return t;
}

std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  if (text.size() > kMaxTextBytes)
    throw RequestError(fmt::format("text of {} bytes is longer than the {} bytes tprun tokenizes", text.size(), kMaxTextBytes));
  decode_utf8(text, "prompt");  // RequestError for invalid UTF-8
  const std::vector<Piece> pieces = pre_tokenize(impl, split_added_and_normalize(impl, text));
  std::vector<int64_t> ids;  // step 4: the model
  for (const auto& p : pieces) {
    if (p.id >= 0) ids.push_back(p.id);
    else impl.model.tokenize(p.text, ids);
  }
  return add_special_tokens ? post_process(impl, std::move(ids)) : ids;
}

TokenizerOutput HfTokenizer::encode_padded(const std::string& text, int64_t max_length, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  const int64_t n_special = add_special_tokens ? impl.special_tokens_added() : 0;
  if (max_length < 1 || max_length < n_special)
    throw RequestError(fmt::format("tokenizer {}: max_length {} is shorter than the {} special tokens it adds", impl.folder,
                                   max_length, n_special));
  if (!impl.pad_id)
    throw RequestError(fmt::format("tokenizer {}: padding to max_length needs a pad token and the tokenizer has none "
                                   "(tokenizer_config.json pad_token)",
                                   impl.folder));
  std::vector<int64_t> content = encode(text, /*add_special_tokens=*/false);
  TokenizerOutput out;
  out.untruncated_length = static_cast<int64_t>(content.size()) + n_special;
  const size_t keep = static_cast<size_t>(max_length - n_special);
  if (content.size() > keep) {
    if (impl.truncate_left) content.erase(content.begin(), content.end() - static_cast<std::ptrdiff_t>(keep));
    else content.resize(keep);
  }
  std::vector<int64_t> ids = add_special_tokens ? post_process(impl, std::move(content)) : std::move(content);
  const size_t pad = static_cast<size_t>(max_length) - ids.size();
  std::vector<int64_t> mask(ids.size(), 1);
  if (impl.pad_left) {
    ids.insert(ids.begin(), pad, *impl.pad_id);
    mask.insert(mask.begin(), pad, 0);
  } else {
    ids.insert(ids.end(), pad, *impl.pad_id);
    mask.insert(mask.end(), pad, 0);
  }
  out.input_ids = std::move(ids);
  out.attention_mask = std::move(mask);
  return out;
}

ChatTemplateKind HfTokenizer::chat_template(ChatCaller caller) const {
  const Impl& impl = *impl_;
  const auto& src = caller == ChatCaller::kProcessor ? impl.processor_chat_template : impl.tokenizer_chat_template;
  if (!src)
    throw CheckpointError(fmt::format(
        "{}: no chat template for the {} (looked for {})", impl.folder,
        caller == ChatCaller::kProcessor ? "processor" : "tokenizer",
        caller == ChatCaller::kProcessor ? "processor_config.json chat_template, chat_template.json, chat_template.jinja"
                                         : "chat_template.jinja, tokenizer_config.json chat_template"));
  if (!src->kind)
    throw CheckpointError(fmt::format("chat template of {} is not one tprun knows (known: qwen3, mistral3); refusing "
                                      "rather than building a different prompt",
                                      src->file));
  return *src->kind;
}

std::string HfTokenizer::apply_chat_template(const ChatRequest& request) const {
  return render_chat(chat_template(request.caller), request, impl_->bos_token);
}

TokenizerOutput HfTokenizer::encode_chat(const ChatRequest& request, int64_t max_length) const {
  const std::string text = apply_chat_template(request);
  bool add_special = true;
  if (request.caller == ChatCaller::kProcessor && impl_->bos_token && text.rfind(*impl_->bos_token, 0) == 0)
    add_special = false;
  return encode_padded(text, max_length, add_special);
}

int64_t HfTokenizer::vocab_size() const {
  int64_t n = impl_->model.max_id() + 1;
  for (const auto& t : impl_->added) n = std::max(n, t.id + 1);
  return n;
}

void HfTokenizer::require_pad_token(const std::string& pipeline) const {
  if (impl_->pad_id) return;
  throw CheckpointError(
      fmt::format("{}: pad_token is null or missing (and tokenizer.json has no padding.pad_token); a {} pads every "
                  "prompt, so every request would fail: set pad_token to a token of the vocabulary (Qwen's is "
                  "\"<|endoftext|>\")",
                  impl_->config_file, pipeline),
      true);
}

void HfTokenizer::check_ids_below(int64_t encoder_vocab_size, const std::string& encoder_config) const {
  const int64_t n = vocab_size();
  if (n <= encoder_vocab_size) return;
  // The added tokens past the encoder's vocabulary, each with where it was named.
  std::vector<std::string> beyond;
  for (const auto& t : impl_->added) {
    if (t.id < encoder_vocab_size) continue;
    std::string where;
    for (const auto& [content, origin] : impl_->named_origins)
      if (content == t.content) where = origin;
    const bool in_model = impl_->model.token_id(t.content) >= 0;
    beyond.push_back(where.empty() || in_model
                         ? fmt::format("'{}' (id {})", clip_text(t.content), t.id)
                         : fmt::format("'{}' (id {}: {} names a token tokenizer.json's vocabulary and added_tokens do "
                                       "not have, so transformers adds it as a new token)",
                                       clip_text(t.content), t.id, where));
    if (beyond.size() == 4) break;
  }
  throw CheckpointError(fmt::format("{}: the tokenizer has {} tokens but the text encoder's vocab_size is {} ({}){}{}",
                                    impl_->folder, n, encoder_vocab_size, encoder_config,
                                    beyond.empty() ? "" : "; beyond it: ", fmt::join(beyond, ", ")),
                        true);
}

std::optional<int64_t> HfTokenizer::token_id(const std::string& token) const {
  if (auto id = impl_->added_id(token)) return id;
  const int64_t v = impl_->model.token_id(token);
  if (v >= 0) return v;
  return std::nullopt;
}

std::optional<std::string> HfTokenizer::bos_token() const { return impl_->bos_token; }
std::optional<std::string> HfTokenizer::pad_token() const { return impl_->pad_token; }
const std::string& HfTokenizer::folder() const { return impl_->folder; }

}  // namespace tprun::text
