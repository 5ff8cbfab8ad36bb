#include "text/tokenizer_common.h"

#include <filesystem>

#include <algorithm>

#include <fmt/format.h>
#include <unicode/uchar.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "text/hf_bpe.h"

namespace tprun::text {

std::vector<AddedToken> parse_added_tokens(const nlohmann::json& config, const std::string& file) {
  std::vector<AddedToken> tokens;
  auto it = config.find("added_tokens_decoder");
  if (it == config.end()) return tokens;
  if (!it->is_object()) throw CheckpointError(fmt::format("{}: added_tokens_decoder is not an object", file));
  for (const auto& [key, entry] : it->items()) {
    AddedToken t;
    try {
      size_t used = 0;
      t.id = std::stoll(key, &used);
      if (used != key.size() || t.id < 0) throw std::invalid_argument(key);
    } catch (const std::exception&) {
      throw CheckpointError(fmt::format("{}: added_tokens_decoder key '{}' is not a token id", file, key));
    }
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
        entry["content"].get<std::string>().empty())
      throw CheckpointError(
          fmt::format("{}: added_tokens_decoder['{}'] has no non-empty string 'content'", file, key));
    t.content = entry["content"].get<std::string>();
    for (auto [name, flag] : {std::pair<const char*, bool*>{"lstrip", &t.lstrip}, {"rstrip", &t.rstrip}}) {
      if (!entry.contains(name)) continue;
      if (!entry[name].is_boolean())
        throw CheckpointError(fmt::format("{}: added_tokens_decoder['{}'].{} is not a boolean", file, key, name));
      *flag = entry[name].get<bool>();
    }
    tokens.push_back(std::move(t));
  }
  return tokens;
}

static std::string token_string(const nlohmann::json& v, const std::string& file, const std::string& key) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  if (v.is_null()) return {};
  throw CheckpointError(fmt::format("{}: {} is neither a string nor {{\"content\": string}}", file, key));
}

std::string special_token_string(const nlohmann::json& special_map, const std::string& map_file,
                                 const nlohmann::json& config, const std::string& config_file,
                                 const std::string& key) {
  if (special_map.is_object() && special_map.contains(key)) return token_string(special_map[key], map_file, key);
  if (config.is_object() && config.contains(key)) return token_string(config[key], config_file, key);
  return {};
}

// Strips Python-whitespace from the left / right of UTF-8 text.
static std::string py_strip(const std::string& s, bool left, bool right) {
  std::u32string u = decode_utf8(s, "prompt");
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && is_python_space(u[b])) ++b;
  if (right)
    while (e > b && is_python_space(u[e - 1])) --e;
  return encode_utf8(u.substr(b, e - b));
}

AddedTokenTrie added_token_trie(const std::vector<AddedToken>& tokens) {
  AddedTokenTrie trie;
  for (size_t k = 0; k < tokens.size(); ++k) trie.add(tokens[k].content, static_cast<int32_t>(k));
  return trie;
}

std::vector<TextPiece> split_on_added_tokens(const std::string& text, const std::vector<AddedToken>& tokens,
                                             const AddedTokenTrie& trie) {
  std::vector<TextPiece> pieces;
  std::string pending;
  size_t i = 0;
  while (i < text.size()) {
    const auto match = trie.find(text, i);
    if (!match) break;
    const AddedToken* best = &tokens[static_cast<size_t>(match->index)];
    pending.append(text, i, match->begin - i);
    pieces.push_back({std::move(pending), nullptr});
    pending.clear();
    pieces.push_back({best->content, best});
    i = match->end;
  }
  pending.append(text, i, std::string::npos);
  pieces.push_back({std::move(pending), nullptr});
  // lstrip / rstrip of the added tokens (transformers strips the neighbours).
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (!pieces[k].token) continue;
    if (pieces[k].token->rstrip && k + 1 < pieces.size() && !pieces[k + 1].token)
      pieces[k + 1].text = py_strip(pieces[k + 1].text, true, false);
    if (pieces[k].token->lstrip && k > 0 && !pieces[k - 1].token)
      pieces[k - 1].text = py_strip(pieces[k - 1].text, false, true);
  }
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const TextPiece& p) { return p.text.empty(); }),
               pieces.end());
  return pieces;
}

std::u32string decode_utf8(const std::string& text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    char32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c, len = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F, len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F, len = 3;
    } else if ((c & 0xF8) == 0xF0) {
      cp = c & 0x07, len = 4;
    } else {
      throw RequestError(fmt::format("{}: invalid UTF-8 byte 0x{:02x} at offset {}", what, c, i));
    }
    if (i + len > n) throw RequestError(fmt::format("{}: truncated UTF-8 sequence at offset {}", what, i));
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80)
        throw RequestError(fmt::format("{}: invalid UTF-8 continuation byte at offset {}", what, i + k));
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static const char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      throw RequestError(fmt::format("{}: invalid UTF-8 sequence at offset {}", what, i));
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

bool is_python_space(char32_t c) {
  // CPython: category Zs or bidirectional class WS, B or S.
  const auto ch = static_cast<UChar32>(c);
  if (u_charType(ch) == U_SPACE_SEPARATOR) return true;
  const UCharDirection d = u_charDirection(ch);
  return d == U_WHITE_SPACE_NEUTRAL || d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR;
}

nlohmann::json read_optional_json(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nlohmann::json::object();
  nlohmann::json j = read_json_file(path, what);
  if (!j.is_object()) throw CheckpointError(fmt::format("{}: {} is not a JSON object", path, what));
  return j;
}

nlohmann::json read_bounded_json(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot be read ({})", path, ec.message()));
  if (static_cast<int64_t>(size) > HfTokenizerLimits::kMaxFileBytes)
    throw CheckpointError(fmt::format("{}: {} bytes, above the limit of {} for a {}", path, size,
                                      HfTokenizerLimits::kMaxFileBytes, what));
  return read_json_file(path, what);
}

}  // namespace tprun::text
