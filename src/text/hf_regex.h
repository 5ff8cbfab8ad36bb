#pragma once
// The regular expressions of tokenizer.json pre-tokenizers ("Split" with a
// {"Regex": ...} pattern, ByteLevel's built-in GPT-2 pattern), matched the way
// the tokenizers library matches them (Oniguruma, Ruby syntax, UTF-8): on code
// points, leftmost-first alternation, greedy quantifiers with backtracking.
//
// Only the subset these patterns use is accepted; anything else is a
// std::invalid_argument naming the construct, never a silently different match:
//   alternation |; groups (?:..) (..) (?i:..) (case-insensitive literals only);
//   look-ahead (?=..) (?!..); literals and escapes (\r \n \t \f \v \e \0 \xhh
//   \uhhhh and escaped punctuation); classes [..] [^..] with ranges; \s \S \d
//   \D \w \W and \p{..} \P{..} of the Unicode general categories (L Lu Ll Lt
//   Lm Lo M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl
//   Zp C Cc Cf Co Cs Cn); quantifiers ? * + {n} {n,} {n,m} (greedy).
// Onig's Unicode meanings: \s = U+0009..U+000D, U+0085 and Z*; \d = Nd;
// \w = L, M, Nd, Pc. Case-insensitive literals compare simple case folds
// (so (?i:'s) matches "'S" and "'ſ" as Oniguruma does).

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
  // code-point indices, in the order Oniguruma's find_iter returns them (an
  // empty match right after the previous match is skipped by one character).
  // Throws std::runtime_error when a match needs more than a fixed number of
  // backtracking steps (a pathological input, never a normal prompt).
  std::vector<std::pair<size_t, size_t>> find_all(const std::u32string& text) const;

  const std::string& pattern() const { return pattern_; }

  struct Program;

 private:
  std::string pattern_;
  std::shared_ptr<const Program> program_;
};

}  // namespace tprun::text
