#pragma once
// Regular expressions a user supplies (memory.layerwise_casting.skip, ...),
// compiled with RE2: matching takes time linear in the text whatever the
// pattern, so a pattern like "(.*)*Q" cannot hang a load the way a
// backtracking engine (std::regex) does. RE2's syntax is Python's re and
// ECMAScript's without backreferences or lookaround
// (https://github.com/google/re2/wiki/Syntax). Torch-free.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace re2 {
class RE2;
}

namespace tprun {

// Longest pattern accepted (a real skip pattern is a few dozen characters).
constexpr size_t kMaxUserPatternLength = 1024;

// Why `pattern` is refused (too long, not valid RE2 syntax, a construct RE2
// lacks, too large to compile), as a sentence for "<key>: <why>"; nullopt
// when it compiles.
std::optional<std::string> user_pattern_problem(const std::string& pattern);

// A list of compiled patterns, searched as Python's re.search does (a match
// anywhere in the text).
class UserPatterns {
 public:
  UserPatterns() = default;
  // ConfigError (raised alike on every rank) "<key>: <why>" for the first
  // pattern refused.
  UserPatterns(const std::vector<std::string>& patterns, const std::string& key);

  bool empty() const { return compiled_.empty(); }
  size_t size() const { return compiled_.size(); }
  // Whether any pattern matches somewhere in `text`.
  bool search(std::string_view text) const;

 private:
  // shared_ptr: destructible where RE2 is an incomplete type.
  std::vector<std::shared_ptr<const re2::RE2>> compiled_;
};

}  // namespace tprun
