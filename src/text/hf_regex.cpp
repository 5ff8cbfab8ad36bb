#include "text/hf_regex.h"

#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include "text/tokenizer_common.h"

namespace tprun::text {

namespace {

// ---- the accepted subset, rewritten for ICU -------------------------------------

bool is_category(const std::string& name) {
  static const char* const kNames[] = {"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl",
                                       "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk",
                                       "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Co", "Cs", "Cn"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

// Checks a tokenizer.json pattern against the subset hf_regex.h lists and
// writes the same expression in ICU's syntax: every literal becomes \x{..}
// (ICU's \v, \0 and set syntax such as {..} and && mean other things), groups
// become non-capturing, classes and properties keep their meaning.
class PatternRewriter {
 public:
  explicit PatternRewriter(const std::u32string& pattern) : p_(pattern) {}

  std::string rewrite() {
    alternation(false);
    if (i_ != p_.size()) fail("unbalanced ')'");
    return out_;
  }

 private:
  const std::u32string& p_;
  size_t i_ = 0;
  std::string out_;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(fmt::format("{} at character {}", what, i_));
  }
  bool at(char32_t c) const { return i_ < p_.size() && p_[i_] == c; }
  void literal(char32_t c) { out_ += fmt::format("\\x{{{:x}}}", static_cast<uint32_t>(c)); }

  // Returns whether the alternation may match the empty string.
  bool alternation(bool icase) {
    bool nullable = sequence(icase);
    while (at(U'|')) {
      ++i_;
      out_ += '|';
      nullable = sequence(icase) || nullable;
    }
    return nullable;
  }

  bool sequence(bool icase) {
    bool nullable = true;
    while (i_ < p_.size() && !at(U'|') && !at(U')')) {
      bool look = false;
      const bool atom_nullable = atom(icase, look);
      nullable = quantify(atom_nullable, look) && nullable;
    }
    return nullable;
  }

  bool atom(bool icase, bool& look) {
    const char32_t c = p_[i_];
    if (c == U'(') return group(icase, look);
    if (c == U'[') {
      if (icase) fail("a character class inside (?i:...) is not supported");
      bracket_class();
      return false;
    }
    if (c == U'.' || c == U'^' || c == U'$') fail(fmt::format("'{}' is not supported", static_cast<char>(c)));
    if (c == U'*' || c == U'+' || c == U'?' || c == U'{') fail("a quantifier follows nothing");
    ++i_;
    if (c != U'\\') {
      literal(c);
    } else if (!escape(/*literal_only=*/icase)) {
      fail("only literals may be case-insensitive");
    }
    return false;
  }

  bool group(bool icase, bool& look) {
    ++i_;  // '('
    bool nullable = true;
    if (at(U'?') && i_ + 1 < p_.size() && (p_[i_ + 1] == U'=' || p_[i_ + 1] == U'!')) {
      out_ += p_[i_ + 1] == U'=' ? "(?=" : "(?!";
      i_ += 2;
      alternation(icase);
      look = true;
    } else if (at(U'?') && i_ + 1 < p_.size() && p_[i_ + 1] == U':') {
      i_ += 2;
      out_ += "(?:";
      nullable = alternation(icase);
    } else if (at(U'?') && i_ + 2 < p_.size() && p_[i_ + 1] == U'i' && p_[i_ + 2] == U':') {
      i_ += 3;
      out_ += "(?i:";
      nullable = alternation(true);
    } else if (at(U'?')) {
      fail("this group kind is not supported");
    } else {
      out_ += "(?:";
      nullable = alternation(icase);
    }
    if (!at(U')')) fail("missing ')'");
    ++i_;
    out_ += ')';
    return nullable;
  }

  int number() {
    if (i_ >= p_.size() || p_[i_] < U'0' || p_[i_] > U'9') fail("a number was expected");
    int v = 0;
    while (i_ < p_.size() && p_[i_] >= U'0' && p_[i_] <= U'9') {
      v = v * 10 + static_cast<int>(p_[i_++] - U'0');
      if (v > 1000) fail("a repeat count above 1000");
    }
    return v;
  }

  // Copies a quantifier after an atom; returns whether the quantified atom may match empty.
  bool quantify(bool nullable, bool look) {
    if (i_ >= p_.size()) return nullable;
    const char32_t c = p_[i_];
    if (c != U'*' && c != U'+' && c != U'?' && c != U'{') return nullable;
    if (look) fail("a quantified look-ahead is not supported");
    if (nullable) fail("a quantified expression that can match the empty string is not supported");
    ++i_;
    bool may_be_empty = c != U'+';
    if (c == U'{') {
      const int min = number();
      int max = min;
      if (at(U',')) {
        ++i_;
        max = at(U'}') ? -1 : number();
      }
      if (!at(U'}')) fail("missing '}'");
      ++i_;
      if (max >= 0 && max < min) fail("a repeat range with max < min");
      out_ += max == min ? fmt::format("{{{}}}", min) : max < 0 ? fmt::format("{{{},}}", min) : fmt::format("{{{},{}}}", min, max);
      may_be_empty = min == 0;
    } else {
      out_ += static_cast<char>(c);
    }
    if (at(U'?') || at(U'+')) fail("lazy and possessive quantifiers are not supported");
    if (at(U'*') || at(U'{')) fail("a quantifier follows a quantifier");
    return may_be_empty;
  }

  char32_t hex(size_t digits) {
    char32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      if (i_ >= p_.size()) fail("a short hexadecimal escape");
      const char32_t h = p_[i_++];
      int d;
      if (h >= U'0' && h <= U'9') d = static_cast<int>(h - U'0');
      else if (h >= U'a' && h <= U'f') d = static_cast<int>(h - U'a') + 10;
      else if (h >= U'A' && h <= U'F') d = static_cast<int>(h - U'A') + 10;
      else fail("a bad hexadecimal escape");
      v = v * 16 + static_cast<char32_t>(d);
    }
    return v;
  }

  // After a backslash: writes the escape; returns false for a class escape
  // (\s, \p{..}, ...) when `literal_only`. Sets `last_literal` for ranges.
  bool escape(bool literal_only, char32_t* last_literal = nullptr) {
    if (i_ >= p_.size()) fail("a trailing backslash");
    const char32_t c = p_[i_++];
    char32_t lit = 0;
    switch (c) {
      case U'r': lit = U'\r'; break;
      case U'n': lit = U'\n'; break;
      case U't': lit = U'\t'; break;
      case U'f': lit = U'\f'; break;
      case U'v': lit = U'\v'; break;
      case U'a': lit = U'\a'; break;
      case U'e': lit = 0x1B; break;
      case U'0': lit = 0; break;
      case U'x': lit = hex(2); break;
      case U'u': lit = hex(4); break;
      case U's': case U'S': case U'd': case U'D':
        if (literal_only) return false;
        out_ += '\\';
        out_ += static_cast<char>(c);
        return true;
      case U'p': case U'P':
        if (literal_only) return false;
        property(c == U'P');
        return true;
      default:
        if ((c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z') || (c >= U'1' && c <= U'9'))
          fail(fmt::format("the escape \\{} is not supported", static_cast<char>(c)));
        lit = c;  // escaped punctuation or other symbol
    }
    literal(lit);
    if (last_literal) *last_literal = lit;
    return true;
  }

  void property(bool negated) {
    if (!at(U'{')) fail("\\p needs {Name}");
    ++i_;
    std::string name;
    while (i_ < p_.size() && p_[i_] != U'}') {
      if (p_[i_] > 0x7F) fail("a bad property name");
      name += static_cast<char>(p_[i_++]);
    }
    if (!at(U'}')) fail("missing '}' of \\p{...}");
    ++i_;
    if (!name.empty() && name[0] == '^') {
      negated = !negated;
      name.erase(0, 1);
    }
    if (!is_category(name)) fail(fmt::format("the property \\p{{{}}} is not supported", name));
    out_ += fmt::format("\\{}{{{}}}", negated ? 'P' : 'p', name);
  }

  // One class member: a literal (returned, for a range) or a class escape (returns false).
  bool class_member(char32_t& lit) {
    const char32_t c = p_[i_];
    if (c == U'[') fail("nested classes are not supported");
    if (c == U'&' && i_ + 1 < p_.size() && p_[i_ + 1] == U'&') fail("class intersection is not supported");
    lit = 0x110000;
    if (c == U'\\') {
      ++i_;
      escape(false, &lit);
      return lit != 0x110000;
    }
    ++i_;
    literal(c);
    lit = c;
    return true;
  }

  void bracket_class() {
    ++i_;  // '['
    out_ += '[';
    if (at(U'^')) {
      out_ += '^';
      ++i_;
    }
    for (bool first = true;; first = false) {
      if (i_ >= p_.size()) fail("missing ']'");
      if (at(U']') && !first) {
        ++i_;
        break;
      }
      char32_t lo = 0;
      const bool is_literal = class_member(lo);
      // A range a-b (a '-' before ']' is a literal).
      if (is_literal && at(U'-') && i_ + 1 < p_.size() && p_[i_ + 1] != U']') {
        ++i_;
        out_ += '-';
        char32_t hi = 0;
        if (!class_member(hi) || hi < lo) fail("a bad class range");
      }
    }
    out_ += ']';
  }
};

}  // namespace

// The compiled pattern and idle matchers (a matcher holds per-search state;
// find_all borrows one so that several threads can search at once).
struct SplitRegex::Program {
  std::unique_ptr<icu::RegexPattern> pattern;
  std::mutex mutex;
  std::vector<std::unique_ptr<icu::RegexMatcher>> idle;
};

namespace {

// ICU's time limit, in its match-engine steps (roughly milliseconds): far
// above any prompt, below a hang.
constexpr int32_t kMatchTimeLimit = 20000;
// ICU's backtracking stack: unlimited (0). Its default, 8 MB, overflows on a
// run of a million spaces, which Oniguruma splits; the stack grows with the
// text (about 60 MB for HfTokenizer's largest, 1 MiB).
constexpr int32_t kMatchStackBytes = 0;
// A matcher that searched a text longer than this is dropped, not kept idle
// with its grown stack.
constexpr size_t kKeepMatcherBelow = size_t{1} << 16;

class BorrowedMatcher {
 public:
  BorrowedMatcher(SplitRegex::Program& program, size_t text_size) : program_(program), keep_(text_size < kKeepMatcherBelow) {
    {
      std::lock_guard<std::mutex> lock(program_.mutex);
      if (!program_.idle.empty()) {
        matcher_ = std::move(program_.idle.back());
        program_.idle.pop_back();
      }
    }
    if (!matcher_) {
      UErrorCode status = U_ZERO_ERROR;
      matcher_.reset(program_.pattern->matcher(status));
      if (U_SUCCESS(status)) matcher_->setTimeLimit(kMatchTimeLimit, status);
      if (U_SUCCESS(status)) matcher_->setStackLimit(kMatchStackBytes, status);
      if (U_FAILURE(status)) throw std::runtime_error(fmt::format("pre-tokenizer regex: {}", u_errorName(status)));
    }
  }
  ~BorrowedMatcher() {
    if (!keep_) return;
    std::lock_guard<std::mutex> lock(program_.mutex);
    program_.idle.push_back(std::move(matcher_));
  }
  BorrowedMatcher(const BorrowedMatcher&) = delete;
  BorrowedMatcher& operator=(const BorrowedMatcher&) = delete;
  icu::RegexMatcher& operator*() { return *matcher_; }

 private:
  SplitRegex::Program& program_;
  const bool keep_;
  std::unique_ptr<icu::RegexMatcher> matcher_;
};

}  // namespace

SplitRegex SplitRegex::compile(const std::string& pattern) {
  std::u32string p;
  try {
    p = decode_utf8(pattern, "regex");
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
  const std::string icu_pattern = PatternRewriter(p).rewrite();
  auto program = std::make_shared<Program>();
  UErrorCode status = U_ZERO_ERROR;
  UParseError where;
  program->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern), 0, where, status));
  if (U_FAILURE(status))
    throw std::invalid_argument(fmt::format("ICU refuses the pattern: {} at character {}", u_errorName(status), where.offset));
  SplitRegex r;
  r.pattern_ = pattern;
  r.program_ = std::move(program);
  return r;
}

std::vector<std::pair<size_t, size_t>> SplitRegex::find_all(const std::u32string& text) const {
  const icu::UnicodeString utf16 =
      icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(text.data()), static_cast<int32_t>(text.size()));
  BorrowedMatcher matcher(*program_, text.size());
  (*matcher).reset(utf16);
  // ICU reports UTF-16 offsets; count code points up to each one as the matches advance.
  int32_t unit = 0;
  size_t code_point = 0;
  auto to_code_point = [&](int32_t target) {
    while (unit < target) {
      unit += U16_IS_LEAD(utf16.charAt(unit)) ? 2 : 1;
      ++code_point;
    }
    return code_point;
  };
  std::vector<std::pair<size_t, size_t>> out;
  UErrorCode status = U_ZERO_ERROR;
  while ((*matcher).find(status)) {
    const int32_t begin = (*matcher).start(status), end = (*matcher).end(status);
    if (U_FAILURE(status)) break;
    const size_t b = to_code_point(begin);
    out.emplace_back(b, to_code_point(end));
  }
  if (U_FAILURE(status))
    throw std::runtime_error(fmt::format("pre-tokenizer regex: the text needs too much backtracking ({})",
                                         u_errorName(status)));
  return out;
}

}  // namespace tprun::text
