// User-supplied regular expressions (runtime/user_pattern.h): RE2 search
// semantics as Python's re.search for the patterns tprun's defaults use,
// linear time on the patterns that hang a backtracking engine, and one
// ConfigError naming the key for what RE2 refuses (backreferences,
// lookaround, syntax errors, over-long or over-large patterns).
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/user_pattern.h"

namespace tprun {
namespace {

std::string config_error(const std::vector<std::string>& patterns) {
  try {
    UserPatterns p(patterns, "memory.layerwise_casting.skip");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(UserPattern, SearchSemantics) {
  UserPatterns p({"norm", "^proj_out$", "blocks\\.1$"}, "k");
  EXPECT_EQ(p.size(), 3u);
  EXPECT_TRUE(p.search("transformer_blocks.0.norm1"));
  EXPECT_TRUE(p.search("proj_out"));
  EXPECT_FALSE(p.search("single_transformer_blocks.0.proj_out"));
  EXPECT_TRUE(p.search("transformer_blocks.1"));
  EXPECT_FALSE(p.search("transformer_blocks.10"));
  EXPECT_TRUE(UserPatterns({"^$"}, "k").search(""));
  EXPECT_TRUE(UserPatterns({""}, "k").search("anything"));
  EXPECT_FALSE(UserPatterns({}, "k").search("anything"));
  EXPECT_TRUE(UserPatterns({}, "k").empty());
  EXPECT_TRUE(UserPatterns({"\\d+\\.attn"}, "k").search("blocks.12.attn.to_q"));
}

TEST(UserPattern, CatastrophicPatternsAreLinear) {
  // Each hangs std::regex (exponential backtracking) on a long non-matching text.
  const std::string text(5000, 'a');
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* p : {"(.*)*Q", "(a+)+$b", "(a|aa)+Q", "(a*)*b", "^(([a-z])+.)+[A-Z]([a-z])+$"}) {
    UserPatterns re({p}, "k");
    EXPECT_FALSE(re.search(text)) << p;
  }
  EXPECT_TRUE(UserPatterns({"(.*)*Q"}, "k").search(text + "Q"));
  // A loose bound (linear time is milliseconds): only an exponential engine comes near it.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

TEST(UserPattern, RefusedPatternsNameTheKey) {
  for (const char* p : {"(a)\\1", "foo(?=bar)", "foo(?!bar)", "(?<=a)b", "(?<!a)b", "(unclosed", "a**", "[z-a]"}) {
    const std::string msg = config_error({"ok", p});
    EXPECT_NE(msg.find("memory.layerwise_casting.skip: '"), std::string::npos) << p << ": " << msg;
    EXPECT_NE(msg.find("is not a regular expression in RE2 syntax"), std::string::npos) << p << ": " << msg;
    EXPECT_NE(msg.find("re2/wiki/Syntax"), std::string::npos) << msg;
    EXPECT_TRUE(user_pattern_problem(p).has_value()) << p;
  }
  EXPECT_NE(config_error({"(a)\\1"}).find("without backreferences (\\1) or lookaround"), std::string::npos);
  EXPECT_NE(config_error({std::string(kMaxUserPatternLength + 1, 'a')}).find("longer than 1024 characters"),
            std::string::npos);
  // Past the compile budget: refused, not compiled into gigabytes.
  EXPECT_FALSE(config_error({"((((a{100}){100}){100}){100})"}).empty());
  EXPECT_FALSE(user_pattern_problem("^proj_in$").has_value());
  EXPECT_FALSE(user_pattern_problem(std::string(kMaxUserPatternLength, 'a')).has_value());
}

}  // namespace
}  // namespace tprun
