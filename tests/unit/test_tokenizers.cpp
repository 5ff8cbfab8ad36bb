// The CLIP and T5 tokenizers against the reference ids of transformers 4.57.6
// (tests/data/tokenizers = the reference set shared/ref/tokenizers, see TEXT.md): every
// case's input_ids, attention_mask and untruncated_length exactly; plus
// truncation and the errors for missing or malformed files.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::text {
namespace {

namespace fs = std::filesystem;

constexpr int kCases = 30;

fs::path data_dir() { return test::data_dir("tokenizers"); }

const nlohmann::json& cases() {
  static const nlohmann::json j = [] {
    std::ifstream in(data_dir() / "cases.json");
    if (!in) return nlohmann::json::object();
    return nlohmann::json::parse(in);
  }();
  return j;
}

const ClipTokenizer& clip() {
  static const ClipTokenizer t((data_dir() / "tokenizer").string());
  return t;
}

const T5Tokenizer& t5() {
  static const T5Tokenizer t((data_dir() / "tokenizer_2").string());
  return t;
}

std::vector<int64_t> ints(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }

using test::TempDir;

// Copies a reference tokenizer folder into `dst` (writable copies).
void copy_folder(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src)) {
    fs::copy_file(e.path(), dst / e.path().filename(), fs::copy_options::overwrite_existing);
    fs::permissions(dst / e.path().filename(), fs::perms::owner_read | fs::perms::owner_write);
  }
}

template <typename Fn>
std::string error_message(Fn fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError thrown)";
}

TEST(TokenizerReference, HasAllCases) {
  ASSERT_TRUE(cases().contains("cases")) << data_dir() << "/cases.json (set TPRUN_SRC to the source folder)";
  EXPECT_EQ(cases()["cases"].size(), static_cast<size_t>(kCases));
  EXPECT_EQ(clip().vocab_size(), cases()["tokenizer"]["vocab_size"].get<size_t>());
  EXPECT_EQ(clip().bos_id(), cases()["tokenizer"]["bos_token_id"].get<int64_t>());
  EXPECT_EQ(clip().eos_id(), cases()["tokenizer"]["eos_token_id"].get<int64_t>());
  EXPECT_EQ(clip().pad_id(), cases()["tokenizer"]["pad_token_id"].get<int64_t>());
  EXPECT_EQ(clip().model_max_length(), 77);
  EXPECT_EQ(t5().vocab_size(), cases()["tokenizer_2"]["vocab_size"].get<int64_t>());
  EXPECT_EQ(t5().eos_id(), cases()["tokenizer_2"]["eos_token_id"].get<int64_t>());
  EXPECT_EQ(t5().pad_id(), cases()["tokenizer_2"]["pad_token_id"].get<int64_t>());
  EXPECT_EQ(t5().unk_id(), cases()["tokenizer_2"]["unk_token_id"].get<int64_t>());
}

class ClipTokenizerCase : public ::testing::TestWithParam<int> {};
class T5TokenizerCase : public ::testing::TestWithParam<int> {};

TEST_P(ClipTokenizerCase, MatchesReference) {
  ASSERT_TRUE(cases().contains("cases")) << data_dir() << "/cases.json (set TPRUN_SRC to the source folder)";
  ASSERT_LT(static_cast<size_t>(GetParam()), cases()["cases"].size());
  const auto& c = cases()["cases"][GetParam()];
  SCOPED_TRACE(c["name"].get<std::string>());
  const int64_t max_length = cases()["tokenizer"]["call"]["max_length"].get<int64_t>();
  const TokenizerOutput out = clip().encode(c["prompt"].get<std::string>(), max_length);
  EXPECT_EQ(out.input_ids, ints(c["clip"]["input_ids"]));
  EXPECT_EQ(out.attention_mask, ints(c["clip"]["attention_mask"]));
  EXPECT_EQ(out.untruncated_length, c["clip"]["untruncated_length"].get<int64_t>());
}

TEST_P(T5TokenizerCase, MatchesReference) {
  ASSERT_TRUE(cases().contains("cases")) << data_dir() << "/cases.json (set TPRUN_SRC to the source folder)";
  ASSERT_LT(static_cast<size_t>(GetParam()), cases()["cases"].size());
  const auto& c = cases()["cases"][GetParam()];
  SCOPED_TRACE(c["name"].get<std::string>());
  const int64_t max_length = cases()["tokenizer_2"]["call"]["max_length"].get<int64_t>();
  const TokenizerOutput out = t5().encode(c["prompt"].get<std::string>(), max_length);
  EXPECT_EQ(out.input_ids, ints(c["t5"]["input_ids"]));
  EXPECT_EQ(out.attention_mask, ints(c["t5"]["attention_mask"]));
  EXPECT_EQ(out.untruncated_length, c["t5"]["untruncated_length"].get<int64_t>());
}

INSTANTIATE_TEST_SUITE_P(Reference, ClipTokenizerCase, ::testing::Range(0, kCases));
INSTANTIATE_TEST_SUITE_P(Reference, T5TokenizerCase, ::testing::Range(0, kCases));

TEST(TokenizerTruncation, KeepsEndOfSequenceLast) {
  // "a photo of a cat": CLIP 912 320 742 522 320 709 913; T5 ends in </s> = 1.
  const TokenizerOutput c = clip().encode("a photo of a cat", 4);
  EXPECT_EQ(c.input_ids, (std::vector<int64_t>{912, 320, 742, 913}));
  EXPECT_EQ(c.attention_mask, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(c.untruncated_length, 7);
  const TokenizerOutput full = t5().encode("a photo of a cat", 16);
  const TokenizerOutput t = t5().encode("a photo of a cat", 3);
  EXPECT_EQ(t.input_ids, (std::vector<int64_t>{full.input_ids[0], full.input_ids[1], t5().eos_id()}));
  EXPECT_EQ(t.untruncated_length, full.untruncated_length);
  EXPECT_EQ(t5().encode("", 2).input_ids, (std::vector<int64_t>{t5().eos_id(), t5().pad_id()}));
  EXPECT_THROW(clip().encode("x", 1), RequestError);
  EXPECT_THROW(t5().encode("x", 0), RequestError);
  EXPECT_THROW(clip().encode("bad \xff utf-8"), RequestError);
  EXPECT_THROW(t5().encode("bad \xc3", 8), RequestError);
}

TEST(TokenizerErrors, MissingVocabNamesTheFile) {
  TempDir tmp;
  copy_folder(data_dir() / "tokenizer", tmp.path() / "tokenizer");
  fs::remove(tmp.path() / "tokenizer" / "vocab.json");
  const std::string msg = error_message([&] { ClipTokenizer t((tmp.path() / "tokenizer").string()); });
  EXPECT_NE(msg.find("vocab.json"), std::string::npos) << msg;
}

TEST(TokenizerErrors, MalformedVocabNamesTheFile) {
  TempDir tmp;
  copy_folder(data_dir() / "tokenizer", tmp.path() / "tokenizer");
  std::ofstream(tmp.path() / "tokenizer" / "vocab.json") << "{\"a\": 1, \"b\": \"two\"}";
  const std::string msg = error_message([&] { ClipTokenizer t((tmp.path() / "tokenizer").string()); });
  EXPECT_NE(msg.find("vocab.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
  std::ofstream(tmp.path() / "tokenizer" / "vocab.json") << "{\"a\": 1,";
  const std::string msg2 = error_message([&] { ClipTokenizer t((tmp.path() / "tokenizer").string()); });
  EXPECT_NE(msg2.find("vocab.json"), std::string::npos) << msg2;
}

TEST(TokenizerErrors, MalformedMergesLineNamesTheFileAndLine) {
  TempDir tmp;
  copy_folder(data_dir() / "tokenizer", tmp.path() / "tokenizer");
  std::ofstream(tmp.path() / "tokenizer" / "merges.txt") << "#version: 0.2\nt h\nbroken\ni n\n";
  const std::string msg = error_message([&] { ClipTokenizer t((tmp.path() / "tokenizer").string()); });
  EXPECT_NE(msg.find("merges.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  fs::remove(tmp.path() / "tokenizer" / "merges.txt");
  const std::string msg2 = error_message([&] { ClipTokenizer t((tmp.path() / "tokenizer").string()); });
  EXPECT_NE(msg2.find("merges.txt"), std::string::npos) << msg2;
}

TEST(TokenizerErrors, MissingOrBadSpieceModelNamesTheFile) {
  TempDir tmp;
  copy_folder(data_dir() / "tokenizer_2", tmp.path() / "tokenizer_2");
  fs::remove(tmp.path() / "tokenizer_2" / "spiece.model");
  const std::string msg = error_message([&] { T5Tokenizer t((tmp.path() / "tokenizer_2").string()); });
  EXPECT_NE(msg.find("spiece.model"), std::string::npos) << msg;
  std::ofstream(tmp.path() / "tokenizer_2" / "spiece.model") << "not a model";
  const std::string msg2 = error_message([&] { T5Tokenizer t((tmp.path() / "tokenizer_2").string()); });
  EXPECT_NE(msg2.find("spiece.model"), std::string::npos) << msg2;
  std::ofstream(tmp.path() / "tokenizer_2" / "special_tokens_map.json") << "{\"eos_token\": 5}";
  fs::copy_file(data_dir() / "tokenizer_2" / "spiece.model", tmp.path() / "tokenizer_2" / "spiece.model",
                fs::copy_options::overwrite_existing);
  const std::string msg3 = error_message([&] { T5Tokenizer t((tmp.path() / "tokenizer_2").string()); });
  EXPECT_NE(msg3.find("special_tokens_map.json"), std::string::npos) << msg3;
}

}  // namespace
}  // namespace tprun::text
