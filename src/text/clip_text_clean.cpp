#include "text/clip_text_clean.h"

#include <fmt/format.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::text {
namespace {

uint32_t gc_mask(char32_t c) { return U_GET_GC_MASK(static_cast<UChar32>(c)); }
bool is_letter(char32_t c) { return (gc_mask(c) & U_GC_L_MASK) != 0; }
bool is_number(char32_t c) { return (gc_mask(c) & U_GC_N_MASK) != 0; }

// BasicTokenizer._is_control / _is_whitespace.
bool is_control(char32_t c) {
  if (c == U'\t' || c == U'\n' || c == U'\r') return false;
  return (gc_mask(c) & U_GC_C_MASK) != 0;
}
bool is_whitespace(char32_t c) {
  if (c == U' ' || c == U'\t' || c == U'\n' || c == U'\r') return true;
  return u_charType(static_cast<UChar32>(c)) == U_SPACE_SEPARATOR;
}

// BasicTokenizer._is_chinese_char.
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

icu::UnicodeString to_icu(const std::u32string& s) {
  return icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(s.data()), static_cast<int32_t>(s.size()));
}

std::u32string from_icu(const icu::UnicodeString& s) {
  std::string utf8;
  s.toUTF8String(utf8);
  return decode_utf8(utf8, "ICU output");
}

std::u32string nfc(const std::u32string& s) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* norm = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw Error(Error::Kind::Internal, fmt::format("ICU NFC: {}", u_errorName(status)));
  icu::UnicodeString out = norm->normalize(to_icu(s), status);
  if (U_FAILURE(status)) throw Error(Error::Kind::Internal, fmt::format("ICU NFC: {}", u_errorName(status)));
  return from_icu(out);
}

std::u32string lower(const std::u32string& s) {
  icu::UnicodeString u = to_icu(s);
  u.toLower(icu::Locale::getRoot());
  return from_icu(u);
}

// Python's str.split(): runs of whitespace separate, none at the ends.
std::vector<std::u32string> split_ws(const std::u32string& s) {
  std::vector<std::u32string> words;
  std::u32string cur;
  for (char32_t c : s) {
    if (is_python_space(c)) {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

// The regex module's IGNORECASE comparison of one character (simple case folding).
bool same_ci(char32_t a, char32_t b) {
  return a == b || u_foldCase(static_cast<UChar32>(a), U_FOLD_CASE_DEFAULT) ==
                       u_foldCase(static_cast<UChar32>(b), U_FOLD_CASE_DEFAULT);
}

bool match_literal(const std::u32string& s, size_t i, const std::u32string& lit) {
  if (s.size() - i < lit.size()) return false;
  for (size_t k = 0; k < lit.size(); ++k)
    if (!same_ci(s[i + k], lit[k])) return false;
  return true;
}

bool is_regex_space(char32_t c) { return is_python_space(c) || u_isUWhiteSpace(static_cast<UChar32>(c)); }

}  // namespace

std::string clip_basic_clean(const std::string& text) {
  const std::u32string in = decode_utf8(text, "prompt");
  std::u32string cleaned;
  cleaned.reserve(in.size());
  for (char32_t c : in) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      cleaned += U' ';
    } else if (is_cjk(c)) {
      cleaned += U' ';
      cleaned += c;
      cleaned += U' ';
    } else {
      cleaned += c;
    }
  }
  std::u32string joined;
  for (const auto& w : split_ws(nfc(cleaned))) {
    if (!joined.empty()) joined += U' ';
    joined += lower(w);
  }
  std::string out;
  for (const auto& w : split_ws(joined)) {
    if (!out.empty()) out += ' ';
    out += encode_utf8(w);
  }
  return out;
}

std::vector<std::string> clip_pretokenize(const std::string& text) {
  static const std::u32string kLiterals[] = {U"<|startoftext|>", U"<|endoftext|>", U"'s", U"'t", U"'re",
                                             U"'ve", U"'m", U"'ll", U"'d"};
  const std::u32string s = decode_utf8(text, "prompt");
  std::vector<std::string> words;
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    for (const auto& lit : kLiterals) {
      if (match_literal(s, i, lit)) {
        len = lit.size();
        break;
      }
    }
    if (len == 0) {
      if (is_letter(s[i])) {
        while (i + len < s.size() && is_letter(s[i + len])) ++len;
      } else if (is_number(s[i])) {
        len = 1;
      } else if (!is_regex_space(s[i])) {
        while (i + len < s.size() && !is_regex_space(s[i + len]) && !is_letter(s[i + len]) &&
               !is_number(s[i + len]))
          ++len;
      }
    }
    if (len == 0) {
      ++i;  // whitespace: no match here
      continue;
    }
    words.push_back(encode_utf8(s.substr(i, len)));
    i += len;
  }
  return words;
}

}  // namespace tprun::text
