#include "text/chat_template.h"

#include <cctype>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::text {

extern const char* const kQwen3TemplateFirst;
extern const char* const kQwen3TemplateLater;
extern const char* const kMistral3Template;

const char* const kFlux2SystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation.";

const char* chat_template_name(ChatTemplateKind kind) {
  return kind == ChatTemplateKind::kQwen3 ? "qwen3" : "mistral3";
}

ChatRequest flux2_klein_chat(const std::string& prompt) {
  ChatRequest r;
  r.user = prompt;
  r.form = ContentForm::kString;
  r.add_generation_prompt = true;
  r.enable_thinking = false;
  r.caller = ChatCaller::kTokenizer;
  return r;
}

ChatRequest flux2_dev_chat(const std::string& prompt, const std::string& system_message) {
  ChatRequest r;
  std::string cleaned = prompt;
  for (size_t at = cleaned.find("[IMG]"); at != std::string::npos; at = cleaned.find("[IMG]", at)) cleaned.erase(at, 5);
  r.system = system_message;
  r.user = cleaned;
  r.form = ContentForm::kTextParts;
  r.add_generation_prompt = false;
  r.caller = ChatCaller::kProcessor;
  return r;
}

// ---- canonical form ----------------------------------------------------------------

namespace {

[[noreturn]] void lex_fail(const std::string& what, size_t pos) {
  throw std::invalid_argument(fmt::format("{} at offset {}", what, pos));
}

bool is_space(char32_t c) {  // Python's str.isspace / \s
  return is_python_space(c);
}

// Python's str.rstrip() on UTF-8.
std::string rstrip(const std::string& s) {
  std::u32string u = decode_utf8(s, "chat template");
  while (!u.empty() && is_space(u.back())) u.pop_back();
  return encode_utf8(u);
}

// Python unicode-escape decoding of a Jinja string literal body.
std::string unescape(const std::string& body, size_t pos) {
  const std::u32string u = decode_utf8(body, "chat template");
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (u[i] != U'\\' || i + 1 >= u.size()) {
      out.push_back(u[i]);
      continue;
    }
    const char32_t c = u[++i];
    auto hex = [&](size_t n) {
      char32_t v = 0;
      for (size_t k = 1; k <= n; ++k) {
        if (i + k >= u.size()) lex_fail("a short escape in a string literal", pos);
        const char32_t h = u[i + k];
        int d = (h >= U'0' && h <= U'9') ? static_cast<int>(h - U'0')
                : (h >= U'a' && h <= U'f') ? static_cast<int>(h - U'a') + 10
                : (h >= U'A' && h <= U'F') ? static_cast<int>(h - U'A') + 10
                                           : -1;
        if (d < 0) lex_fail("a bad escape in a string literal", pos);
        v = v * 16 + static_cast<char32_t>(d);
      }
      i += n;
      return v;
    };
    switch (c) {
      case U'\n': break;  // line continuation
      case U'\\': out.push_back(U'\\'); break;
      case U'\'': out.push_back(U'\''); break;
      case U'"': out.push_back(U'"'); break;
      case U'a': out.push_back(7); break;
      case U'b': out.push_back(8); break;
      case U'f': out.push_back(12); break;
      case U'n': out.push_back(10); break;
      case U'r': out.push_back(13); break;
      case U't': out.push_back(9); break;
      case U'v': out.push_back(11); break;
      case U'x': out.push_back(hex(2)); break;
      case U'u': out.push_back(hex(4)); break;
      case U'U': out.push_back(hex(8)); break;
      case U'N': lex_fail("\\N{...} escapes are not supported", pos);
      default:
        if (c >= U'0' && c <= U'7') {
          char32_t v = static_cast<char32_t>(c - U'0');
          for (int k = 0; k < 2 && i + 1 < u.size() && u[i + 1] >= U'0' && u[i + 1] <= U'7'; ++k)
            v = v * 8 + static_cast<char32_t>(u[++i] - U'0');
          out.push_back(v);
        } else {
          out.push_back(U'\\');
          out.push_back(c);
        }
    }
  }
  for (char32_t c : out)
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) lex_fail("an escape outside Unicode", pos);
  return encode_utf8(out);
}

std::string json_quoted(const std::string& s) { return nlohmann::json(s).dump(); }

class JinjaCanonicalizer {
 public:
  explicit JinjaCanonicalizer(const std::string& text) {
    // Newlines normalised; one trailing newline dropped (keep_trailing_newline=False).
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\r') {
        src_ += '\n';
        if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
      } else {
        src_ += text[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::string run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t start = next_tag_start(pos);
      if (start == std::string::npos) {
        data(src_.substr(pos));
        break;
      }
      const char kind = src_[start + 1];
      size_t after = start + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      data(strip_before_tag(src_.substr(pos, start - pos), kind, sign, line_starting));
      pos = kind == '#' ? comment(after, line_starting) : tag(kind, after, line_starting);
    }
    flush();
    return out_;
  }

 private:
  std::string src_, out_, pending_;

  void data(const std::string& s) { pending_ += s; }

  // The first "{{", "{%" or "{#" at or after `pos`, or npos.
  size_t next_tag_start(size_t pos) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // The text before a tag after whitespace control: "-" strips all trailing
  // whitespace; lstrip_blocks strips the spaces before a block or comment tag
  // that starts its line, unless the tag says "+".
  static std::string strip_before_tag(std::string text, char kind, char sign, bool line_starting) {
    if (sign == '-') return rstrip(text);
    if (sign == '+' || kind == '{') return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos > 0 || line_starting) {
      const std::string tail = text.substr(l_pos);
      if (!tail.empty() && rstrip(tail).empty()) text.resize(l_pos);
    }
    return text;
  }
  void flush() {
    if (!pending_.empty()) out_ += "D " + json_quoted(pending_) + "\n";
    pending_.clear();
  }

  // Skips whitespace (Python \s) from `pos`.
  size_t skip_space(size_t pos) const {
    while (pos < src_.size()) {
      const unsigned char c = static_cast<unsigned char>(src_[pos]);
      if (c < 0x80) {
        if (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x1F)) {
          ++pos;
          continue;
        }
        break;
      }
      size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (pos + len > src_.size() || !is_space(decode_utf8(src_.substr(pos, len), "chat template")[0])) break;
      pos += len;
    }
    return pos;
  }

  size_t comment(size_t pos, bool& line_starting) {
    const size_t end = src_.find("#}", pos);
    if (end == std::string::npos) lex_fail("an unclosed comment", pos);
    size_t next = end + 2;
    const char before = end > pos ? src_[end - 1] : 0;
    if (before == '-') next = skip_space(next);
    else if (before != '+' && next < src_.size() && src_[next] == '\n') ++next;  // trim_blocks
    line_starting = next > 0 && src_[next - 1] == '\n';
    return next;
  }

  // At a tag's end marker ("%}", "-%}", "+%}", "}}", "-}}"): moves `pos` past
  // it (and past the whitespace "-" or trim_blocks removes) and returns true.
  bool tag_end(char kind, size_t& pos) const {
    if (kind == '%') {
      if (src_.compare(pos, 3, "+%}") == 0) {
        pos += 3;
        return true;
      }
      if (src_.compare(pos, 3, "-%}") == 0) {
        pos = skip_space(pos + 3);
        return true;
      }
      if (src_.compare(pos, 2, "%}") == 0) {
        pos += 2;
        if (pos < src_.size() && src_[pos] == '\n') ++pos;  // trim_blocks
        return true;
      }
      return false;
    }
    if (src_.compare(pos, 3, "-}}") == 0) {
      pos = skip_space(pos + 3);
      return true;
    }
    if (src_.compare(pos, 2, "}}") == 0) {
      pos += 2;
      return true;
    }
    return false;
  }

  // One token inside a tag at `pos` (not whitespace): a number, a name, a
  // string literal (by its decoded value) or an operator; returns the position after it.
  size_t lex_token(size_t pos, std::vector<std::string>& tokens, std::vector<char>& balance) const {
    const char c = src_[pos];
    if (c >= '0' && c <= '9') {
      size_t e = pos;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_' || src_[e] == '.')) ++e;
      tokens.push_back("N" + src_.substr(pos, e - pos));
      return e;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      tokens.push_back(src_.substr(pos, e - pos));
      return e;
    }
    if (c == '\'' || c == '"') {
      size_t e = pos + 1;
      while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
      if (e >= src_.size()) lex_fail("an unclosed string literal", pos);
      tokens.push_back("S" + json_quoted(unescape(src_.substr(pos + 1, e - pos - 1), pos)));
      return e + 1;
    }
    static const char* kOps[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                 "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};
    const char* op = nullptr;
    for (const char* o : kOps)
      if (src_.compare(pos, std::char_traits<char>::length(o), o) == 0) {
        op = o;
        break;
      }
    if (!op) lex_fail(fmt::format("unexpected character '{}' in a tag", c), pos);
    const std::string o(op);
    if (o == "(" || o == "[" || o == "{") balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
    if (o == ")" || o == "]" || o == "}") {
      if (balance.empty() || balance.back() != o[0]) lex_fail("unbalanced brackets in a tag", pos);
      balance.pop_back();
    }
    tokens.push_back(o);
    return pos + o.size();
  }

  size_t tag(char kind, size_t pos, bool& line_starting) {
    std::vector<std::string> tokens;
    std::vector<char> balance;
    while (true) {
      if (pos >= src_.size()) lex_fail("an unclosed tag", pos);
      if (balance.empty() && tag_end(kind, pos)) break;
      const size_t ws = skip_space(pos);
      pos = ws != pos ? ws : lex_token(pos, tokens, balance);
    }
    if (kind == '%' && !tokens.empty() && (tokens[0] == "raw" || tokens[0] == "include" || tokens[0] == "import" ||
                                           tokens[0] == "extends" || tokens[0] == "from"))
      lex_fail(fmt::format("'{}' blocks are not supported", tokens[0]), pos);
    flush();
    out_ += kind == '%' ? "B" : "V";
    for (const auto& t : tokens) out_ += " " + t;
    out_ += "\n";
    line_starting = pos > 0 && src_[pos - 1] == '\n';
    return pos;
  }
};

struct Known {
  ChatTemplateKind kind;
  std::string canonical;
};

const std::vector<Known>& known_templates() {
  static const std::vector<Known> known = {
      {ChatTemplateKind::kQwen3, canonical_chat_template(kQwen3TemplateFirst)},
      {ChatTemplateKind::kQwen3, canonical_chat_template(kQwen3TemplateLater)},
      {ChatTemplateKind::kMistral3, canonical_chat_template(kMistral3Template)},
  };
  return known;
}

}  // namespace

std::string canonical_chat_template(const std::string& text) {
  try {
    decode_utf8(text, "chat template");
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
  return JinjaCanonicalizer(text).run();
}

std::optional<ChatTemplateKind> recognize_chat_template(const std::string& text) {
  std::string canonical;
  try {
    canonical = canonical_chat_template(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  for (const auto& k : known_templates())
    if (k.canonical == canonical) return k.kind;
  return std::nullopt;
}

const std::string& chat_template_text(ChatTemplateKind kind) {
  static const std::string qwen3 = kQwen3TemplateLater, mistral3 = kMistral3Template;
  return kind == ChatTemplateKind::kQwen3 ? qwen3 : mistral3;
}

// ---- renderers ----------------------------------------------------------------------

std::string render_chat(ChatTemplateKind kind, const ChatRequest& r, const std::optional<std::string>& bos_token) {
  if (kind == ChatTemplateKind::kQwen3) {
    if (r.form != ContentForm::kString)
      throw RequestError("the qwen3 chat template renders text-part contents as '' (or fails); tprun renders only "
                         "string contents with it");
    std::string out;
    if (r.system) out += "<|im_start|>system\n" + *r.system + "<|im_end|>\n";
    out += "<|im_start|>user\n" + r.user + "<|im_end|>\n";
    if (r.add_generation_prompt) {
      out += "<|im_start|>assistant\n";
      if (r.enable_thinking.has_value() && !*r.enable_thinking) out += "<think>\n\n</think>\n\n";
    }
    return out;
  }
  // mistral3: bos, system (first text part), user blocks; add_generation_prompt is unused.
  if (!r.system)
    throw RequestError("the mistral3 chat template without a system message inserts today's date; tprun needs a "
                       "system message");
  if (r.form != ContentForm::kTextParts)
    throw RequestError("the mistral3 chat template reads the system message as messages[0]['content'][0]['text'] "
                       "and fails on a string content; use text parts");
  return bos_token.value_or("") + "[SYSTEM_PROMPT]" + *r.system + "[/SYSTEM_PROMPT][INST]" + r.user + "[/INST]";
}

}  // namespace tprun::text
