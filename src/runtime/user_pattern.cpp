#include "runtime/user_pattern.h"

#include <re2/re2.h>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun {
namespace {

// RE2's compile budget per pattern: ample for any real pattern, and a bound
// on what a hostile one ("a{1000}{1000}") can take.
constexpr int64_t kMaxProgramMemory = 8 << 20;

RE2::Options options() {
  RE2::Options o;
  o.set_log_errors(false);
  o.set_max_mem(kMaxProgramMemory);
  o.set_encoding(RE2::Options::EncodingUTF8);
  return o;
}

std::unique_ptr<RE2> compile(const std::string& pattern, std::string* why) {
  if (pattern.size() > kMaxUserPatternLength) {
    *why = fmt::format("'{}' is longer than {} characters", clip_text(pattern), kMaxUserPatternLength);
    return nullptr;
  }
  auto re = std::make_unique<RE2>(pattern, options());
  if (re->ok()) return re;
  std::string detail = re->error();
  if (re->error_code() == RE2::ErrorPatternTooLarge) detail += "; large counted repetitions need less memory";
  *why = fmt::format("'{}' is not a regular expression in RE2 syntax ({}); patterns use RE2 syntax, Python's re "
                     "without backreferences (\\1) or lookaround ((?=, (?!, (?<=, (?<!): "
                     "https://github.com/google/re2/wiki/Syntax",
                     clip_text(pattern), detail);
  return nullptr;
}

}  // namespace

std::optional<std::string> user_pattern_problem(const std::string& pattern) {
  std::string why;
  if (compile(pattern, &why)) return std::nullopt;
  return why;
}

UserPatterns::UserPatterns(const std::vector<std::string>& patterns, const std::string& key) {
  compiled_.reserve(patterns.size());
  for (const auto& p : patterns) {
    std::string why;
    auto re = compile(p, &why);
    if (!re) throw ConfigError(fmt::format("{}: {}", key, why), true);
    compiled_.push_back(std::move(re));
  }
}

bool UserPatterns::search(std::string_view text) const {
  for (const auto& re : compiled_)
    if (RE2::PartialMatch(re2::StringPiece(text.data(), text.size()), *re)) return true;
  return false;
}

}  // namespace tprun
