// The vocab.json + merges.txt tokenizer layout (text/hf_vocab_merges.h), the
// Qwen-Image tokenizer writer (presets/qwen_image_tokenizer_files.h) and
// padding a batch to its longest text (text/hf_tokenizer_batch.h):
//  - the writer's folder loads back (no tokenizer.json) with the size it
//    returned; every added token is its own id; the special token ids;
//  - the same tokenizer in both layouts gives the same ids on the fixture
//    prompts; tokenizer.json wins when both exist; merges.txt variants that
//    the tokenizers library reads alike (CRLF, #version lines, no final
//    newline) give the same ids;
//  - encode_batch_longest against encode_padded, right and left padding;
//  - refusals: one CheckpointError naming the file and entry for each hostile
//    or malformed file.
// Two helpers for qwen_image_tokenizer_parity.py, skipped unless their
// variable is set: TPRUN_QWEN_TOKENIZER_WRITE=DIR writes tprun's folder into
// DIR; TPRUN_QWEN_TOKENIZER_DUMP=REQUEST.json writes tprun's ids for the request.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "presets/qwen_image_tokenizer_files.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"
#include "test_data.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_batch.h"

namespace tprun::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return json();
  return json::parse(in);
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// tprun's Qwen2.5-VL folder, written once per process (400 merges of the bundled corpus).
const fs::path& written_folder() {
  static test::TempDir tmp;
  static const fs::path dir = [] {
    const fs::path d = tmp.path() / "tokenizer";
    presets::write_qwen25vl_tokenizer(
        d.string(), presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kQwen2SplitPattern, 400));
    return d;
  }();
  return dir;
}

// A copy of the written folder to edit.
fs::path copy_of_written(const test::TempDir& tmp, const std::string& name) {
  const fs::path to = tmp.path() / name;
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(written_folder())) fs::copy_file(e.path(), to / e.path().filename());
  return to;
}

// The slow files (vocab.json, merges.txt) of a tokenizer.json folder.
void write_slow_files(const fs::path& tokenizer_json, const fs::path& dir) {
  const json tj = read_json(tokenizer_json);
  write_text(dir / "vocab.json", tj["model"]["vocab"].dump());
  std::string merges = "#version: 0.2\n";
  for (const auto& m : tj["model"]["merges"])
    merges += (m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>()) + "\n";
  write_text(dir / "merges.txt", merges);
}

std::vector<std::string> fixture_prompts() {
  const json cases = read_json(test::data_dir("hf_tokenizers") / "cases.json");
  std::vector<std::string> out;
  if (cases.is_object())
    for (const auto& p : cases["prompts"]) out.push_back(p.get<std::string>());
  out.push_back("<|im_start|>system\nDescribe the image.<|im_end|>\n<|im_start|>user\na fox<|im_end|>\n<|im_start|>assistant\n");
  return out;
}

const std::string kQwenImageTemplate =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";

std::string qwen_image_text(const std::string& prompt) {
  std::string t = kQwenImageTemplate;
  return t.replace(t.find("{}"), 2, prompt);
}

TEST(HfVocabMerges, WrittenFolderLoadsWithoutTokenizerJson) {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "tok";
  const int64_t n = presets::write_qwen25vl_tokenizer(
      dir.string(), presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kQwen2SplitPattern, 300));
  EXPECT_FALSE(fs::exists(dir / "tokenizer.json"));
  for (const char* f : {"vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json",
                        "tokenizer_config.json", "chat_template.jinja"})
    EXPECT_TRUE(fs::is_regular_file(dir / f)) << f;
  EXPECT_EQ(n, 256 + 300 + 22);
  for (const char* cls : {"Qwen2TokenizerFast", "Qwen2Tokenizer", ""}) {
    SCOPED_TRACE(cls);
    const HfTokenizer tok = HfTokenizer::load(dir.string(), cls);
    EXPECT_EQ(tok.vocab_size(), n);
    EXPECT_EQ(tok.pad_token(), "<|endoftext|>");
    EXPECT_FALSE(tok.bos_token().has_value());
    const auto& added = presets::qwen25vl_added_tokens();
    for (size_t k = 0; k < added.size(); ++k) {
      EXPECT_EQ(tok.token_id(added[k].content), 556 + static_cast<int64_t>(k)) << added[k].content;
      EXPECT_EQ(tok.encode(added[k].content, true), std::vector<int64_t>{556 + static_cast<int64_t>(k)});
    }
    // No special tokens are added around a text; right padding with <|endoftext|>.
    EXPECT_EQ(tok.encode("a cat", true), tok.encode("a cat", false));
    const TokenizerOutput o = tok.encode_padded("a cat", 8);
    EXPECT_EQ(o.input_ids.back(), 556);
    EXPECT_EQ(o.attention_mask.front(), 1);
  }
  EXPECT_THROW(presets::write_qwen25vl_tokenizer(dir.string(), presets::ByteLevelBpe{}), std::exception);
}

TEST(HfVocabMerges, BothLayoutsGiveTheSameIds) {
  test::TempDir tmp;
  const fs::path fixture = test::data_dir("hf_tokenizers") / "qwen3";
  ASSERT_TRUE(fs::is_regular_file(fixture / "tokenizer.json")) << "missing fixture " << fixture;
  const fs::path slow = tmp.path() / "slow";
  fs::create_directories(slow);
  fs::copy_file(fixture / "tokenizer_config.json", slow / "tokenizer_config.json");
  write_slow_files(fixture / "tokenizer.json", slow);
  const HfTokenizer fast = HfTokenizer::load(fixture.string(), "Qwen2TokenizerFast");
  const HfTokenizer slow_tok = HfTokenizer::load(slow.string(), "Qwen2TokenizerFast");
  EXPECT_EQ(fast.vocab_size(), slow_tok.vocab_size());
  int compared = 0;
  for (const auto& p : fixture_prompts()) {
    EXPECT_EQ(fast.encode(p, true), slow_tok.encode(p, true)) << p;
    EXPECT_EQ(fast.encode_padded(p, 16).input_ids, slow_tok.encode_padded(p, 16).input_ids) << p;
    ++compared;
  }
  EXPECT_GT(compared, 20);

  // tokenizer.json wins: broken slow files next to it are not read.
  const fs::path both = tmp.path() / "both";
  fs::create_directories(both);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fixture / f, both / f);
  write_text(both / "vocab.json", "{not json");
  write_text(both / "merges.txt", "x y z\n");
  EXPECT_EQ(HfTokenizer::load(both.string(), "Qwen2TokenizerFast").encode("a fox, 123", true), fast.encode("a fox, 123", true));
}

TEST(HfVocabMerges, MergesTextVariantsReadAlike) {
  test::TempDir tmp;
  const HfTokenizer base = HfTokenizer::load(written_folder().string());
  const std::string merges = read_text(written_folder() / "merges.txt");
  ASSERT_EQ(merges.rfind("#version: 0.2\n", 0), 0u);
  std::string crlf;
  for (char c : merges) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  std::string version_inside = merges;
  version_inside.insert(version_inside.find('\n', 40) + 1, "#version: again\n");
  const std::vector<std::pair<const char*, std::string>> variants = {
      {"crlf", crlf},
      {"no version line", merges.substr(merges.find('\n') + 1)},
      {"#version line inside", version_inside},
      {"no final newline", merges.substr(0, merges.size() - 1)}};
  for (const auto& [name, text] : variants) {
    SCOPED_TRACE(name);
    const fs::path dir = copy_of_written(tmp, name);
    write_text(dir / "merges.txt", text);
    const HfTokenizer tok = HfTokenizer::load(dir.string());
    for (const auto& p : fixture_prompts()) EXPECT_EQ(tok.encode(p, true), base.encode(p, true)) << p;
  }
}

TEST(HfVocabMerges, BatchPadsToTheLongestAndTruncates) {
  test::TempDir tmp;
  const HfTokenizer tok = HfTokenizer::load(written_folder().string());
  const std::vector<std::string> texts = {qwen_image_text("a fox"), qwen_image_text(std::string(200, 'x') + " long"),
                                          qwen_image_text("")};
  for (const int64_t max_length : {int64_t{1058}, int64_t{40}}) {
    SCOPED_TRACE(max_length);
    const TokenizerBatch b = encode_batch_longest(tok, texts, max_length);
    ASSERT_EQ(b.input_ids.size(), texts.size());
    int64_t longest = 0;
    for (const auto& t : texts) longest = std::max<int64_t>(longest, std::min<int64_t>(max_length, tok.encode(t).size()));
    EXPECT_EQ(b.length, longest);
    for (size_t k = 0; k < texts.size(); ++k) {
      const TokenizerOutput full = tok.encode_padded(texts[k], max_length);
      const std::vector<int64_t> ids(full.input_ids.begin(), full.input_ids.begin() + b.length);
      EXPECT_EQ(b.input_ids[k], ids);
      EXPECT_EQ(b.attention_mask[k], std::vector<int64_t>(full.attention_mask.begin(), full.attention_mask.begin() + b.length));
      EXPECT_EQ(b.untruncated_lengths[k], static_cast<int64_t>(tok.encode(texts[k]).size()));
    }
  }
  // Left padding keeps the last ids of each row.
  const fs::path left = copy_of_written(tmp, "left");
  json cfg = read_json(left / "tokenizer_config.json");
  cfg["padding_side"] = "left";
  write_text(left / "tokenizer_config.json", cfg.dump());
  const HfTokenizer ltok = HfTokenizer::load(left.string());
  const TokenizerBatch lb = encode_batch_longest(ltok, {"a", "a fox sat on a mat"}, 64);
  const auto short_ids = ltok.encode("a");
  ASSERT_EQ(lb.input_ids[0].size(), static_cast<size_t>(lb.length));
  EXPECT_EQ(lb.input_ids[0].back(), short_ids.back());
  EXPECT_EQ(lb.attention_mask[0].front(), 0);
  EXPECT_EQ(lb.input_ids[1], ltok.encode("a fox sat on a mat"));
  // Refusals.
  EXPECT_THROW(encode_batch_longest(tok, {}, 8), RequestError);
  EXPECT_THROW(encode_batch_longest(tok, {"a"}, 0), RequestError);
  EXPECT_THROW(encode_batch_longest(tok, {"a"}, int64_t{1} << 40), RequestError);
}

// ---- refusals ------------------------------------------------------------------

std::string load_error(const fs::path& dir, const std::string& cls = "") {
  try {
    HfTokenizer::load(dir.string(), cls);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(HfVocabMerges, RefusesHostileFiles) {
  test::TempDir tmp;
  const json vocab = read_json(written_folder() / "vocab.json");
  const std::string a_token = vocab.begin().key();
  struct Case {
    const char* name;
    const char* file;     // the message names this file ...
    const char* expect;   // ... and contains this
    std::function<void(const fs::path&)> edit;
  };
  auto set_vocab = [](const std::function<void(json&)>& f) {
    return [f](const fs::path& d) {
      json v = read_json(d / "vocab.json");
      f(v);
      write_text(d / "vocab.json", v.dump());
    };
  };
  auto set_config = [](const std::function<void(json&)>& f) {
    return [f](const fs::path& d) {
      json v = read_json(d / "tokenizer_config.json");
      f(v);
      write_text(d / "tokenizer_config.json", v.dump());
    };
  };
  auto append_merge = [](const std::string& line) {
    return [line](const fs::path& d) { write_text(d / "merges.txt", read_text(d / "merges.txt") + line); };
  };
  const std::vector<Case> cases = {
      {"vocab not json", "vocab.json", "not valid JSON", [](const fs::path& d) { write_text(d / "vocab.json", "{\"a\": 0,"); }},
      {"vocab not object", "vocab.json", "not a JSON object", [](const fs::path& d) { write_text(d / "vocab.json", "[1, 2]"); }},
      {"vocab duplicate key", "vocab.json", "twice", [](const fs::path& d) { write_text(d / "vocab.json", "{\"a\": 0, \"a\": 1}"); }},
      {"vocab duplicate id", "vocab.json", "which", set_vocab([](json& v) { v["zz-new"] = 3; })},
      {"vocab id gap", "vocab.json", "must be 0..", set_vocab([](json& v) { v["zz-new"] = 100000; })},
      {"vocab negative id", "vocab.json", "must be 0..", set_vocab([&](json& v) { v[a_token] = -1; })},
      {"vocab string id", "vocab.json", "must be 0..", set_vocab([&](json& v) { v[a_token] = "7"; })},
      {"vocab huge token", "vocab.json", "above the limit", set_vocab([&](json& v) { v[std::string(5000, 'q')] = v.size(); })},
      {"vocab too large", "vocab.json", "above the limit",
       [](const fs::path& d) { fs::resize_file(d / "vocab.json", (int64_t{64} << 20) + 1); }},
      {"merge unknown symbol", "merges.txt", "'zz-unknown' is not in vocab.json", append_merge("zz-unknown Ġ\n")},
      {"merge unknown result", "merges.txt", "the merged token 'Āā'", append_merge("Ā ā\n")},
      {"merge three symbols", "merges.txt", "not two symbols", append_merge("a b c\n")},
      {"merge empty line", "merges.txt", "line 2", [](const fs::path& d) {
         const std::string m = read_text(d / "merges.txt");
         write_text(d / "merges.txt", m.substr(0, m.find('\n') + 1) + "\n" + m.substr(m.find('\n') + 1));
       }},
      {"merges too large", "merges.txt", "above the limit",
       [](const fs::path& d) { fs::resize_file(d / "merges.txt", (int64_t{64} << 20) + 1); }},
      {"merges a folder", "tokenizer.json", "vocab.json + merges.txt", [](const fs::path& d) {
         fs::remove(d / "merges.txt");  // neither layout: the message names both
         fs::create_directories(d / "merges.txt");
       }},
      {"config not json", "tokenizer_config.json", "not valid JSON",
       [](const fs::path& d) { write_text(d / "tokenizer_config.json", "{"); }},
      {"added id collides", "tokenizer_config.json", "added_tokens_decoder['5']", set_config([](json& c) {
         c["added_tokens_decoder"]["5"] = c["added_tokens_decoder"].begin().value();
         c["added_tokens_decoder"]["5"]["content"] = "<|collides|>";
       })},
      {"added id not a number", "tokenizer_config.json", "not a token id",
       set_config([](json& c) { c["added_tokens_decoder"]["x"] = c["added_tokens_decoder"].begin().value(); })},
      {"add_bos_token", "tokenizer_config.json", "add_bos_token", set_config([](json& c) { c["add_bos_token"] = true; })},
      {"add_prefix_space not bool", "tokenizer_config.json", "add_prefix_space",
       set_config([](json& c) { c["add_prefix_space"] = "yes"; })},
      {"other class", "tokenizer_config.json", "'GPT2Tokenizer'", set_config([](json& c) { c["tokenizer_class"] = "GPT2Tokenizer"; })},
      {"no class", "tokenizer_config.json", "is missing", set_config([](json& c) { c.erase("tokenizer_class"); })},
      {"legacy added id wrong", "added_tokens.json", "transformers gives it id", [](const fs::path& d) {
         json c = read_json(d / "tokenizer_config.json");
         c.erase("added_tokens_decoder");
         write_text(d / "tokenizer_config.json", c.dump());
         json a = read_json(d / "added_tokens.json");
         a["<|im_end|>"] = 5;
         write_text(d / "added_tokens.json", a.dump());
       }},
      {"legacy added duplicate id", "added_tokens.json", "has too", [](const fs::path& d) {
         json c = read_json(d / "tokenizer_config.json");
         c.erase("added_tokens_decoder");
         write_text(d / "tokenizer_config.json", c.dump());
         json a = read_json(d / "added_tokens.json");
         a["<|im_end|>"] = a["<|im_start|>"];
         write_text(d / "added_tokens.json", a.dump());
       }},
      {"legacy map malformed", "special_tokens_map.json", "not valid JSON", [](const fs::path& d) {
         json c = read_json(d / "tokenizer_config.json");
         c.erase("added_tokens_decoder");
         write_text(d / "tokenizer_config.json", c.dump());
         write_text(d / "special_tokens_map.json", "{]");
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path dir = copy_of_written(tmp, c.name);
    c.edit(dir);
    const std::string file = (dir / c.file).string();
    const std::string err = load_error(dir);
    EXPECT_NE(err.find(file), std::string::npos) << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
  }
  // The class given by the pipeline is checked too.
  EXPECT_NE(load_error(written_folder(), "PixtralProcessor").find("without tokenizer.json"), std::string::npos);
  EXPECT_NE(load_error(written_folder(), "TokenizersBackend").find("without tokenizer.json"), std::string::npos);
}

// ---- helpers for qwen_image_tokenizer_parity.py -----------------------------------

TEST(HfVocabMerges, WriteForParity) {
  const char* dir = std::getenv("TPRUN_QWEN_TOKENIZER_WRITE");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "TPRUN_QWEN_TOKENIZER_WRITE not set (qwen_image_tokenizer_parity.py sets it)";
  const int64_t n = presets::write_qwen25vl_tokenizer(
      (fs::path(dir) / "written_qwen25vl").string(),
      presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kQwen2SplitPattern, 400));
  write_text(fs::path(dir) / "written_sizes.json", json{{"written_qwen25vl", n}}.dump());
}

// {"folders": [{"name", "path", "class"}], "prompts": [...], "lengths": [...],
//  "batches": [{"texts": [...], "max_length": n}], "out": file} ->
// out: {name: {"vocab_size", "ids": {"plain", "special", "padded_<n>"} per
// prompt, "batches": [{"input_ids", "attention_mask"}]} or {"error"}}.
TEST(HfVocabMerges, DumpForParity) {
  const char* req = std::getenv("TPRUN_QWEN_TOKENIZER_DUMP");
  if (req == nullptr || *req == '\0') GTEST_SKIP() << "TPRUN_QWEN_TOKENIZER_DUMP not set (qwen_image_tokenizer_parity.py sets it)";
  const json request = read_json(req);
  ASSERT_TRUE(request.is_object());
  json out = json::object();
  for (const auto& folder : request["folders"]) {
    json entry;
    try {
      const HfTokenizer tok = HfTokenizer::load(folder["path"].get<std::string>(), folder.value("class", ""));
      entry["vocab_size"] = tok.vocab_size();
      json results = json::array();
      for (const auto& p : request["prompts"]) {
        const std::string prompt = p.get<std::string>();
        json r = {{"plain", tok.encode(prompt, false)}, {"special", tok.encode(prompt, true)}};
        for (const auto& n : request["lengths"]) {
          const TokenizerOutput o = tok.encode_padded(prompt, n.get<int64_t>());
          r["padded_" + std::to_string(n.get<int64_t>())] = {{"input_ids", o.input_ids}, {"attention_mask", o.attention_mask}};
        }
        results.push_back(r);
      }
      entry["results"] = results;
      json batches = json::array();
      for (const auto& b : request["batches"]) {
        const TokenizerBatch got =
            encode_batch_longest(tok, b["texts"].get<std::vector<std::string>>(), b["max_length"].get<int64_t>());
        batches.push_back({{"input_ids", got.input_ids}, {"attention_mask", got.attention_mask}});
      }
      entry["batches"] = batches;
    } catch (const std::exception& e) {
      entry["error"] = e.what();
    }
    out[folder["name"].get<std::string>()] = entry;
  }
  write_text(request["out"].get<std::string>(), out.dump());
}

}  // namespace
}  // namespace tprun::text
