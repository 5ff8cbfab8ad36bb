// Wan's text side (UMT5's tokenizer as transformers 5 builds it, prompt_clean):
//  - the folder presets::write_umt5_tokenizer writes loads back with the size
//    it returned, every added token alone gives its own id, eos is always
//    appended, an unknown character is <unk> (never byte pieces);
//  - refusals naming the file and field: no tokenizer.json (spiece.model
//    alone), a non-Unigram model, an added token at an id transformers would
//    not give it, a special token the vocabulary lacks, a broken charsmap.
// Two helpers for tests/scripts/umt5_parity.py (case `text`), skipped unless
// their variable is set: TPRUN_UMT5_TOKENIZER_WRITE=DIR writes tprun's folder
// (DIR/tokenizer + DIR/written_size.json); TPRUN_UMT5_TOKENIZER_DUMP=REQUEST.json
// writes prompt_clean, the pipeline's ids (WanConditioner::tokenize) and
// plain ids for each prompt of the request.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pipelines/pipeline.h"
#include "pipelines/wan_conditioner.h"
#include "presets/tokenizer_files.h"
#include "presets/umt5_tokenizer_files.h"
#include "runtime/error.h"
#include "text/t5_unigram_tokenizer.h"
#include "text/wan_prompt_clean.h"

namespace tprun::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_text(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fs::path("tprun_umt5_" + std::to_string(::getpid()) + "_" +
                                                std::to_string(std::rand()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// One written folder for the suite (training takes a moment).
const fs::path& written() {
  static TempDir dir;
  static const fs::path folder = [] {
    const fs::path f = dir.path / "tokenizer";
    presets::write_umt5_tokenizer(f.string(), presets::bundled_corpus(), 700, 300);
    return f;
  }();
  return folder;
}

fs::path copy_of(const TempDir& tmp, const std::string& name) {
  const fs::path to = tmp.path / name;
  fs::copy(written(), to, fs::copy_options::recursive);
  return to;
}

TEST(Umt5TokenizerFiles, WrittenFolderLoads) {
  const T5UnigramTokenizer tok(written().string());
  const json cfg = read_json(written() / "tokenizer_config.json");
  EXPECT_EQ(cfg["extra_ids"], 300);
  const json fast = read_json(written() / "tokenizer.json");
  const int64_t pieces = static_cast<int64_t>(fast["model"]["vocab"].size()) - 300;
  EXPECT_EQ(tok.vocab_size(), pieces + 300);
  EXPECT_EQ(fast["model"]["vocab"][3][0], "<0x00>");  // byte pieces follow <unk>, as UMT5's
  EXPECT_TRUE(fast["model"]["byte_fallback"].get<bool>());
  for (const auto& [id, entry] : cfg["added_tokens_decoder"].items()) {
    EXPECT_EQ(tok.content_ids(entry["content"].get<std::string>()), std::vector<int64_t>{std::stoll(id)});
  }
  // eos always appended (the post-processor), also after a literal </s>.
  const auto out = tok.encode("</s>", 4);
  EXPECT_EQ(out.input_ids, (std::vector<int64_t>{tok.eos_id(), tok.eos_id(), tok.pad_id(), tok.pad_id()}));
  EXPECT_EQ(out.attention_mask, (std::vector<int64_t>{1, 1, 0, 0}));
  // A character outside the vocabulary is <unk>, consecutive ones one <unk>, never byte pieces.
  const auto unk = tok.content_ids("\xF0\x9F\xA6\x8A\xF0\x9F\xA6\x8A");  // two foxes: one fused <unk>
  EXPECT_EQ(std::count(unk.begin(), unk.end(), tok.unk_id()), 1);
  for (int64_t id : unk) EXPECT_FALSE(id >= 3 && id < 3 + 256) << "byte piece " << id;
  EXPECT_THROW(presets::write_umt5_tokenizer(written().string(), presets::bundled_corpus()), std::exception);
}

TEST(Umt5TokenizerFiles, Refusals) {
  TempDir tmp;
  auto refused = [](const fs::path& dir, const std::string& needle) {
    try {
      T5UnigramTokenizer tok(dir.string());
      ADD_FAILURE() << dir << " loaded; expected an error with '" << needle << "'";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    const fs::path d = copy_of(tmp, "spiece_only");
    fs::remove(d / "tokenizer.json");
    refused(d, "spiece.model alone is not supported");
  }
  {
    const fs::path d = copy_of(tmp, "bpe");
    json j = read_json(d / "tokenizer.json");
    j["model"]["type"] = "BPE";
    write_text(d / "tokenizer.json", j.dump());
    refused(d, "model.type 'BPE' is not 'Unigram'");
  }
  {
    const fs::path d = copy_of(tmp, "moved_sentinel");
    json j = read_json(d / "tokenizer_config.json");
    json& dec = j["added_tokens_decoder"];
    const std::string last = std::prev(dec.end()).key();
    dec["999999"] = dec[last];
    dec.erase(last);
    write_text(d / "tokenizer_config.json", j.dump());
    refused(d, "added_tokens_decoder gives '");
  }
  {
    const fs::path d = copy_of(tmp, "unknown_pad");
    json j = read_json(d / "tokenizer_config.json");
    j["pad_token"] = "<no-such-pad>";
    write_text(d / "tokenizer_config.json", j.dump());
    json m = read_json(d / "special_tokens_map.json");
    m.erase("pad_token");
    write_text(d / "special_tokens_map.json", m.dump());
    refused(d, "pad_token names '<no-such-pad>', which is neither a piece");
  }
  {
    // tokenizer_config.json's value wins over special_tokens_map.json's (transformers 5): an unknown
    // pad_token there is refused though the map names <pad>, and a null one leaves no pad token.
    const fs::path d = copy_of(tmp, "config_over_map");
    json j = read_json(d / "tokenizer_config.json");
    j["eos_token"] = "<no-such-eos>";
    write_text(d / "tokenizer_config.json", j.dump());
    refused(d, "eos_token names '<no-such-eos>'");
  }
  {
    const fs::path d = copy_of(tmp, "null_pad");
    json j = read_json(d / "tokenizer_config.json");
    j["pad_token"] = nullptr;
    write_text(d / "tokenizer_config.json", j.dump());
    refused(d, "pad_token is null or missing");
  }
  {
    const fs::path d = copy_of(tmp, "bad_charsmap");
    json j = read_json(d / "tokenizer.json");
    j["normalizer"]["precompiled_charsmap"] = "AAAA";
    write_text(d / "tokenizer.json", j.dump());
    refused(d, "precompiled_charsmap");
  }
  {
    const fs::path d = copy_of(tmp, "duplicate_piece");
    json j = read_json(d / "tokenizer.json");
    j["model"]["vocab"][5][0] = j["model"]["vocab"][6][0];
    write_text(d / "tokenizer.json", j.dump());
    refused(d, "appears twice");
  }
  EXPECT_THROW(T5UnigramTokenizer(written().string()).encode("x", 0), RequestError);
  EXPECT_THROW(T5UnigramTokenizer(written().string()).encode("bad \xC3", 8), RequestError);
  EXPECT_THROW(wan_prompt_clean("bad \xFF"), RequestError);
}

// umt5_parity.py: tprun's folder, checked above, into $TPRUN_UMT5_TOKENIZER_WRITE.
TEST(Umt5TokenizerFiles, WriteForParity) {
  const char* dir = std::getenv("TPRUN_UMT5_TOKENIZER_WRITE");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "TPRUN_UMT5_TOKENIZER_WRITE not set (umt5_parity.py sets it)";
  const fs::path root(dir);
  const int64_t n = presets::write_umt5_tokenizer((root / "tokenizer").string(), presets::bundled_corpus(), 700, 300);
  EXPECT_EQ(T5UnigramTokenizer((root / "tokenizer").string()).vocab_size(), n);
  write_text(root / "written_size.json", json{{"size", n}}.dump());
}

// umt5_parity.py: {"pipeline": folder with model_index.json + tokenizer/, "tokenizer": dir, "prompts": [...],
// "lengths": [...], "out": path} -> out: per prompt {"clean", "pipeline_ids", "pipeline_mask", "ids": {len: ids}}
// (or {"error"}).
TEST(Umt5TokenizerFiles, DumpForParity) {
  const char* req = std::getenv("TPRUN_UMT5_TOKENIZER_DUMP");
  if (req == nullptr || *req == '\0') GTEST_SKIP() << "TPRUN_UMT5_TOKENIZER_DUMP not set (umt5_parity.py sets it)";
  const json request = read_json(req);
  const T5UnigramTokenizer tok(request["tokenizer"].get<std::string>());
  json out = json::array();
  for (const auto& p : request["prompts"]) {
    const std::string prompt = p.get<std::string>();
    json entry;
    try {
      entry["clean"] = wan_prompt_clean(prompt);
      const auto tokens = pipelines::WanConditioner::tokenize(request["pipeline"].get<std::string>(), prompt, 512);
      ASSERT_EQ(tokens.size(), 1u);
      entry["pipeline_ids"] = tokens[0].output.input_ids;
      entry["pipeline_mask"] = tokens[0].output.attention_mask;
      json ids = json::object();
      for (const auto& n : request["lengths"])
        ids[std::to_string(n.get<int64_t>())] = tok.encode(prompt, n.get<int64_t>()).input_ids;
      entry["ids"] = ids;
    } catch (const std::exception& e) {
      entry = json{{"error", e.what()}};
    }
    out.push_back(entry);
  }
  write_text(request["out"].get<std::string>(), out.dump());
}

}  // namespace
}  // namespace tprun::text
