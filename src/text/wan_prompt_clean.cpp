// WanPipeline's prompt_clean and Python's html.unescape (see wan_prompt_clean.h).
#include "text/wan_prompt_clean.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include <unicode/uchar.h>

#include "text/html5_entities.h"
#include "text/tokenizer_common.h"

namespace tprun::text {
namespace {

// The text of the named reference `name` (ASCII, as the table keys it), or null.
const char* named_reference(const std::string& name) {
  const auto& table = html5_entities();
  auto it = std::lower_bound(table.begin(), table.end(), name,
                             [](const Html5Entity& e, const std::string& n) { return std::strcmp(e.name, n.c_str()) < 0; });
  return it != table.end() && name == it->name ? it->text : nullptr;
}

bool is_ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_ascii_hex(char32_t c) { return is_ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int hex_value(char32_t c) {
  return is_ascii_digit(c) ? static_cast<int>(c - '0') : static_cast<int>((c | 0x20) - 'a' + 10);
}

// html._replace_charref for a numeric reference of value `num` (`huge`: past
// any code point, where Python's int would be larger still).
void append_numeric(std::string& out, char32_t num, bool huge) {
  if (!huge) {
    const auto& invalid = html_invalid_charrefs();
    auto it = std::lower_bound(invalid.begin(), invalid.end(), num,
                               [](const std::pair<char32_t, const char*>& e, char32_t n) { return e.first < n; });
    if (it != invalid.end() && it->first == num) {
      out += it->second;
      return;
    }
  }
  if (huge || (num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) {
    append_utf8(out, 0xFFFD);
    return;
  }
  const auto& dropped = html_invalid_codepoints();
  if (std::binary_search(dropped.begin(), dropped.end(), num)) return;
  append_utf8(out, num);
}

// One match of html's _charref at s[i] == '&': appends its replacement and
// returns the index after the match, or returns i when nothing matches there.
size_t replace_charref(const std::u32string& s, size_t i, std::string& out) {
  size_t j = i + 1;
  if (j < s.size() && s[j] == '#') {
    // '#[0-9]+;?' | '#[xX][0-9a-fA-F]+;?'; '#' is outside the name class, so nothing else matches.
    const bool hex = j + 1 < s.size() && (s[j + 1] == 'x' || s[j + 1] == 'X');
    size_t k = j + (hex ? 2 : 1);
    const size_t digits_begin = k;
    char32_t num = 0;
    bool huge = false;
    while (k < s.size() && (hex ? is_ascii_hex(s[k]) : is_ascii_digit(s[k]))) {
      const char32_t next = num * (hex ? 16 : 10) + static_cast<char32_t>(hex ? hex_value(s[k]) : s[k] - '0');
      if (huge || next > 0x10FFFF) {
        huge = true;
      } else {
        num = next;
      }
      ++k;
    }
    if (k == digits_begin) return i;  // "&#" / "&#x" without digits: no match
    if (k < s.size() && s[k] == ';') ++k;
    append_numeric(out, num, huge);
    return k;
  }
  // '[^\t\n\f <&#;]{1,32};?'
  size_t k = j;
  while (k < s.size() && k - j < 32) {
    const char32_t c = s[k];
    if (c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' || c == '#' || c == ';') break;
    ++k;
  }
  if (k == j) return i;
  if (k < s.size() && s[k] == ';') ++k;
  const std::u32string name(s, j, k - j);
  // The whole name (with its ';'), else the longest known prefix of at least
  // 2 characters, the rest kept as text (Python: s, then s[:x] for x = len - 1 .. 2).
  auto lookup = [&](size_t len) -> const char* {
    for (size_t c = 0; c < len; ++c)
      if (name[c] >= 0x80) return nullptr;  // every name in the table is ASCII
    return named_reference(std::string(name.begin(), name.begin() + static_cast<std::ptrdiff_t>(len)));
  };
  if (const char* text = lookup(name.size())) {
    out += text;
    return k;
  }
  for (size_t len = name.size() - 1; len >= 2; --len) {
    if (const char* text = lookup(len)) {
      out += text;
      out += encode_utf8(name.substr(len));
      return k;
    }
  }
  out += '&';
  out += encode_utf8(name);
  return k;
}

// Python's str.strip() (whitespace per str.isspace()).
std::u32string python_strip(const std::u32string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_python_space(s[b])) ++b;
  while (e > b && is_python_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace

std::string html_unescape(const std::string& text) {
  if (text.find('&') == std::string::npos) {
    decode_utf8(text, "prompt");  // the same UTF-8 check as every other path
    return text;
  }
  const std::u32string s = decode_utf8(text, "prompt");
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '&') {
      const size_t next = replace_charref(s, i, out);
      if (next != i) {
        i = next;
        continue;
      }
    }
    append_utf8(out, s[i]);
    ++i;
  }
  return out;
}

std::string wan_prompt_clean(const std::string& prompt) {
  // basic_clean (without ftfy): unescape twice, strip.
  const std::u32string basic = python_strip(decode_utf8(html_unescape(html_unescape(prompt)), "prompt"));
  // whitespace_clean: every run of White_Space (the `regex` module's \s)
  // becomes one space, then strip (str.isspace).
  auto white_space = [](char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; };
  std::u32string collapsed;
  collapsed.reserve(basic.size());
  for (size_t i = 0; i < basic.size();) {
    if (white_space(basic[i])) {
      collapsed.push_back(U' ');
      while (i < basic.size() && white_space(basic[i])) ++i;
    } else {
      collapsed.push_back(basic[i++]);
    }
  }
  return encode_utf8(python_strip(collapsed));
}

}  // namespace tprun::text
