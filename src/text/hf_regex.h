#pragma once
// The regular expressions of tokenizer.json pre-tokenizers ("Split" with a
// {"Regex": ...} pattern, ByteLevel's built-in GPT-2 pattern), matched with
// ICU's regex engine (icu::RegexPattern) the way the tokenizers library's
// Oniguruma matches them: on code points, leftmost-first alternation, greedy
// quantifiers with backtracking. ICU is the engine because it gives
// Oniguruma's splits exactly on every case measured (docs/tokenizers.md: the
// Qwen2, Tekken and GPT-2 patterns on the fixture and parity prompts, 10,000
// benchmark prompts and 340k texts made of the Qwen and Tekken vocabularies)
// at the speed of the hand-written engine it replaced.
//
// The two syntaxes differ outside a common core (`.` and `\w` mean other
// things, `\h` is a hex digit in Oniguruma, ICU's sets have operators), so
// only that core is accepted; anything else is a std::invalid_argument naming
// the construct, never a silently different match:
//   alternation |; groups (?:..) (..) (?i:..) (case-insensitive literals only);
//   look-ahead (?=..) (?!..); literals and escapes (\r \n \t \f \v \a \e \0
//   \xhh \uhhhh and escaped punctuation); classes [..] [^..] with ranges; \s
//   \S \d \D and \p{..} \P{..} of the Unicode general categories (L Lu Ll Lt
//   Lm Lo M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl
//   Zp C Cc Cf Co Cs Cn); quantifiers ? * + {n} {n,} {n,m} (greedy), not on
//   a group that may match the empty string.
// There both engines mean the same: \s is White_Space (U+0009..U+000D, U+0085
// and Z*), \d is Nd, case-insensitive literals compare case folds (so
// (?i:'s) matches "'S" and "'ſ").

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tprun::text {

class SplitRegex {
 public:
  // Throws std::invalid_argument for syntax outside the subset above.
  static SplitRegex compile(const std::string& pattern);

  // The non-overlapping matches of the pattern in `text`, as [begin, end)
  // code-point indices, in the order Oniguruma's find_iter returns them.
  // Throws std::runtime_error when a match needs more than a fixed amount of
  // backtracking (a pathological input, never a normal prompt).
  std::vector<std::pair<size_t, size_t>> find_all(const std::u32string& text) const;

  const std::string& pattern() const { return pattern_; }

  struct Program;

 private:
  std::string pattern_;
  std::shared_ptr<Program> program_;
};

}  // namespace tprun::text
