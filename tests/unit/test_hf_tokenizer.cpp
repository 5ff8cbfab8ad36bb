// tokenizer.json tokenizers (HfTokenizer) and the FLUX.2 chat templates:
//  - ids and attention masks exactly as transformers 5 gives them on the
//    folders in tests/data/hf_tokenizers (made by
//    tests/scripts/hf_tokenizer_parity.py --regen with the tokenizers library,
//    expected ids in cases.json), plain, padded and through the chat template;
//  - the folders tprun's writers make load and round-trip;
//  - refusals: unknown chat template, missing / malformed / hostile files;
//  - the pre-tokenizer regex and the template canonical form.
// Two helpers for hf_tokenizer_parity.py, skipped unless their variable is set:
// TPRUN_HF_TOKENIZER_WRITE=DIR writes tprun's folders into DIR;
// TPRUN_HF_TOKENIZER_DUMP=REQUEST.json writes tprun's ids for the request;
// TPRUN_HF_TOKENIZER_BENCH=REQUEST.json times encode over a prompt file for
// tools/bench_tokenizer.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/added_token_trie.h"
#include "text/bpe_merges.h"
#include "text/chat_template.h"
#include "text/hf_regex.h"
#include "text/hf_tokenizer.h"
#include "presets/hf_tokenizer_files.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path data_dir() { return test::data_dir("hf_tokenizers"); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return json();
  return json::parse(in);
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

void copy_folder(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
}

json output_json(const TokenizerOutput& o) {
  json real = json::array();
  for (size_t i = 0; i < o.input_ids.size(); ++i)
    if (o.attention_mask[i]) real.push_back(o.input_ids[i]);
  return {{"ids", o.input_ids}, {"mask", o.attention_mask}, {"real", real}};
}

// All of tprun's outputs for one folder, in the layout cases.json uses.
json run_folder(const HfTokenizer& tok, const json& spec, const json& prompts, const json& lengths) {
  const bool processor = spec.value("caller", "tokenizer") == "processor";
  json out = json::array();
  for (const auto& p : prompts) {
    const std::string prompt = p.get<std::string>();
    json r;
    r["plain"] = tok.encode(prompt, false);
    r["special"] = tok.encode(prompt, true);
    for (const auto& len : lengths) {
      const int64_t n = len.get<int64_t>();
      r["padded_" + std::to_string(n)] = output_json(tok.encode_padded(prompt, n));
      const ChatRequest req = processor ? flux2_dev_chat(prompt) : flux2_klein_chat(prompt);
      r["chat_" + std::to_string(n)] = output_json(tok.encode_chat(req, n));
    }
    out.push_back(r);
  }
  return out;
}

// cases.json holds {"real": ids where the mask is 1, "pad": pad id, "left": bool}
// per padded output; expand and compare with tprun's.
void expect_padded(const json& want, const TokenizerOutput& got, int64_t n, const std::string& what) {
  std::vector<int64_t> ids, mask;
  const auto real = want["real"].get<std::vector<int64_t>>();
  const size_t pad = static_cast<size_t>(n) - real.size();
  if (want["left"].get<bool>()) {
    ids.assign(pad, want["pad"].get<int64_t>());
    mask.assign(pad, 0);
  }
  ids.insert(ids.end(), real.begin(), real.end());
  mask.insert(mask.end(), real.size(), 1);
  if (!want["left"].get<bool>()) {
    ids.insert(ids.end(), pad, want["pad"].get<int64_t>());
    mask.insert(mask.end(), pad, 0);
  }
  EXPECT_EQ(got.input_ids, ids) << what;
  EXPECT_EQ(got.attention_mask, mask) << what;
}

TEST(HfTokenizer, MatchesTransformersOnFixtureFolders) {
  const json cases = read_json(data_dir() / "cases.json");
  ASSERT_TRUE(cases.is_object()) << "missing " << (data_dir() / "cases.json");
  const json& prompts = cases["prompts"];
  int compared = 0;
  for (const auto& folder : cases["folders"]) {
    const std::string name = folder["name"].get<std::string>();
    SCOPED_TRACE(name);
    const HfTokenizer tok = HfTokenizer::load((data_dir() / name).string(), folder.value("class", ""));
    EXPECT_EQ(tok.vocab_size(), folder["vocab_size"].get<int64_t>());
    const bool processor = folder.value("caller", "tokenizer") == "processor";
    ASSERT_EQ(folder["results"].size(), prompts.size());
    for (size_t k = 0; k < prompts.size(); ++k) {
      const std::string prompt = prompts[k].get<std::string>();
      const json& want = folder["results"][k];
      const std::string what = name + " prompt " + std::to_string(k);
      EXPECT_EQ(tok.encode(prompt, false), want["plain"].get<std::vector<int64_t>>()) << what;
      EXPECT_EQ(tok.encode(prompt, true), want["special"].get<std::vector<int64_t>>()) << what;
      for (const auto& len : cases["lengths"]) {
        const int64_t n = len.get<int64_t>();
        expect_padded(want["padded_" + std::to_string(n)], tok.encode_padded(prompt, n), n, what + " padded");
        const ChatRequest req = processor ? flux2_dev_chat(prompt) : flux2_klein_chat(prompt);
        expect_padded(want["chat_" + std::to_string(n)], tok.encode_chat(req, n), n, what + " chat");
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 60);
}

TEST(HfTokenizer, ChatTextsMatchTransformersRendering) {
  const json cases = read_json(data_dir() / "cases.json");
  ASSERT_TRUE(cases.is_object());
  for (const auto& folder : cases["folders"]) {
    if (!folder.contains("chat_texts")) continue;
    const HfTokenizer tok = HfTokenizer::load((data_dir() / folder["name"].get<std::string>()).string(),
                                              folder.value("class", ""));
    const bool processor = folder.value("caller", "tokenizer") == "processor";
    for (size_t k = 0; k < cases["prompts"].size(); ++k) {
      const std::string prompt = cases["prompts"][k].get<std::string>();
      EXPECT_EQ(tok.apply_chat_template(processor ? flux2_dev_chat(prompt) : flux2_klein_chat(prompt)),
                folder["chat_texts"][k].get<std::string>())
          << folder["name"] << " prompt " << k;
    }
  }
}

// ---- tprun's own folders -------------------------------------------------------

TEST(HfTokenizerFiles, WrittenFoldersLoadWithTheirTemplates) {
  test::TempDir tmp;
  const presets::ByteLevelBpe qwen = presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kQwen2SplitPattern, 300);
  const presets::ByteLevelBpe tekken = presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kTekkenSplitPattern, 300);
  EXPECT_EQ(qwen.merges.size(), 300u);
  const int64_t qn = presets::write_qwen3_tokenizer(tmp / "qwen3", qwen);
  const int64_t mn = presets::write_mistral3_tokenizer(tmp / "mistral3", tekken);
  EXPECT_EQ(qn, 256 + 300 + 26);
  EXPECT_EQ(mn, 32 + 256 + 300);
  const HfTokenizer q = HfTokenizer::load(tmp / "qwen3", "Qwen2TokenizerFast");
  const HfTokenizer m = HfTokenizer::load(tmp / "mistral3", "PixtralProcessor");
  EXPECT_EQ(q.vocab_size(), qn);
  EXPECT_EQ(m.vocab_size(), mn);
  EXPECT_EQ(q.chat_template(ChatCaller::kTokenizer), ChatTemplateKind::kQwen3);
  EXPECT_EQ(m.chat_template(ChatCaller::kProcessor), ChatTemplateKind::kMistral3);
  EXPECT_EQ(q.token_id("<|im_start|>").value(), 256 + 300 + 1);
  EXPECT_EQ(m.token_id("[SYSTEM_PROMPT]").value(), 17);
  // The klein prompt: <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
  const TokenizerOutput k = q.encode_chat(flux2_klein_chat("a red fox"), 32);
  EXPECT_EQ(k.input_ids.size(), 32u);
  EXPECT_EQ(k.input_ids[0], *q.token_id("<|im_start|>"));
  EXPECT_EQ(k.input_ids.back(), *q.token_id("<|endoftext|>"));
  // The dev prompt starts with one <s> (the template's; add_special_tokens is then off).
  const TokenizerOutput d = m.encode_chat(flux2_dev_chat("a red fox [IMG]"), 64);
  EXPECT_EQ(d.input_ids[0], 1);
  EXPECT_NE(d.input_ids[1], 1);
  EXPECT_EQ(d.input_ids[1], 17);
  EXPECT_EQ(m.encode("a", true)[0], 1);  // the post-processor's BOS on plain text
  // Existing files are not overwritten.
  EXPECT_THROW(presets::write_qwen3_tokenizer(tmp / "qwen3", qwen), std::exception);
}

// Writes tprun's Qwen3 and Mistral-3 folders for hf_tokenizer_parity.py (which
// compares them with transformers) after checking here that each loads back
// with the size the writer returned and that every added token encodes to its
// own id alone.
TEST(HfTokenizerFiles, WriteForParity) {
  const char* dir = std::getenv("TPRUN_HF_TOKENIZER_WRITE");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "TPRUN_HF_TOKENIZER_WRITE not set (hf_tokenizer_parity.py sets it)";
  const fs::path root(dir);
  const int64_t qn = presets::write_qwen3_tokenizer((root / "written_qwen3").string(),
                                           presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kQwen2SplitPattern, 400));
  const int64_t mn = presets::write_mistral3_tokenizer((root / "written_mistral3").string(),
                                              presets::train_byte_level_bpe(presets::bundled_corpus(), presets::kTekkenSplitPattern, 400));
  struct Written {
    const char* name;
    const char* cls;
    int64_t size;
    ChatCaller caller;
  };
  for (const Written& w : {Written{"written_qwen3", "Qwen2TokenizerFast", qn, ChatCaller::kTokenizer},
                           Written{"written_mistral3", "PixtralProcessor", mn, ChatCaller::kProcessor}}) {
    SCOPED_TRACE(w.name);
    const HfTokenizer tok = HfTokenizer::load((root / w.name).string(), w.cls);
    EXPECT_EQ(tok.vocab_size(), w.size);
    EXPECT_NO_THROW(tok.chat_template(w.caller));
    const json cfg = read_json(root / w.name / "tokenizer_config.json");
    ASSERT_FALSE(cfg["added_tokens_decoder"].empty());
    for (const auto& [id, entry] : cfg["added_tokens_decoder"].items()) {
      const std::string content = entry["content"].get<std::string>();
      EXPECT_EQ(tok.token_id(content), std::stoll(id)) << content;
      EXPECT_EQ(tok.encode(content, false), std::vector<int64_t>{std::stoll(id)}) << content;
    }
  }
  write_text(root / "written_sizes.json", json{{"written_qwen3", qn}, {"written_mistral3", mn}}.dump());
}

TEST(HfTokenizerFiles, DumpForParity) {
  const char* req = std::getenv("TPRUN_HF_TOKENIZER_DUMP");
  if (req == nullptr || *req == '\0') GTEST_SKIP() << "TPRUN_HF_TOKENIZER_DUMP not set (hf_tokenizer_parity.py sets it)";
  const json request = read_json(req);
  ASSERT_TRUE(request.is_object());
  json out = json::object();
  for (const auto& folder : request["folders"]) {
    const std::string name = folder["name"].get<std::string>();
    json entry;
    try {
      const HfTokenizer tok = HfTokenizer::load(folder["path"].get<std::string>(), folder.value("class", ""));
      entry["vocab_size"] = tok.vocab_size();
      entry["results"] = run_folder(tok, folder, request["prompts"], request["lengths"]);
      json texts = json::array();
      const bool processor = folder.value("caller", "tokenizer") == "processor";
      for (const auto& p : request["prompts"])
        texts.push_back(tok.apply_chat_template(processor ? flux2_dev_chat(p.get<std::string>())
                                                          : flux2_klein_chat(p.get<std::string>())));
      entry["chat_texts"] = texts;
    } catch (const std::exception& e) {
      entry["error"] = e.what();
    }
    out[name] = entry;
  }
  json kinds = json::array();  // recognition of template variants
  for (const auto& t : request.value("templates", json::array())) {
    const auto kind = recognize_chat_template(t.get<std::string>());
    kinds.push_back(kind ? json(chat_template_name(*kind)) : json());
  }
  out["_templates"] = kinds;
  write_text(request["out"].get<std::string>(), out.dump());
}

// tools/bench_tokenizer: {"folder", "class", "prompts": file of a JSON list of
// strings, "repeats", "out"} -> out: {"ids": per prompt encode(prompt, true),
// "load_seconds", "encode_seconds": the best of `repeats` passes over all
// prompts, one thread}.
TEST(HfTokenizerFiles, BenchForTool) {
  const char* req = std::getenv("TPRUN_HF_TOKENIZER_BENCH");
  if (req == nullptr || *req == '\0') GTEST_SKIP() << "TPRUN_HF_TOKENIZER_BENCH not set (tools/bench_tokenizer sets it)";
  const json request = read_json(req);
  ASSERT_TRUE(request.is_object());
  const std::vector<std::string> prompts = read_json(request["prompts"].get<std::string>()).get<std::vector<std::string>>();
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const HfTokenizer tok = HfTokenizer::load(request["folder"].get<std::string>(), request.value("class", ""));
  const double load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  json ids = json::array();
  for (const auto& p : prompts) ids.push_back(tok.encode(p, true));
  double best = 1e30;
  size_t checksum = 0;
  for (int r = 0; r < request.value("repeats", 3); ++r) {
    const auto start = Clock::now();
    for (const auto& p : prompts) checksum += tok.encode(p, true).size();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  EXPECT_GT(checksum, 0u);
  write_text(request["out"].get<std::string>(),
             json{{"ids", ids}, {"load_seconds", load_seconds}, {"encode_seconds", best}, {"prompts", prompts.size()}}.dump());
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

TEST(HfTokenizer, RefusesAnUnknownChatTemplate) {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "qwen3";
  copy_folder(data_dir() / "qwen3", dir);
  json cfg = read_json(dir / "tokenizer_config.json");
  std::string tpl = cfg["chat_template"].get<std::string>();
  const std::string needle = "<|im_start|>assistant\\n";
  ASSERT_NE(tpl.find(needle), std::string::npos);
  tpl.replace(tpl.find(needle), needle.size(), "<|im_start|>bot\\n");  // one emitted word
  write_text(dir / "chat_template.jinja", tpl);
  const HfTokenizer tok = HfTokenizer::load(dir.string(), "Qwen2TokenizerFast");
  try {
    tok.encode_chat(flux2_klein_chat("x"), 16);
    FAIL() << "an unknown template was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("chat template of " + (dir / "chat_template.jinja").string() +
                                         " is not one tprun knows (known: qwen3, mistral3)"),
              std::string::npos)
        << e.what();
  }
  // Re-indented and re-quoted, the known template is still known.
  std::string reindented = cfg["chat_template"].get<std::string>();
  for (size_t at = reindented.find("\n    "); at != std::string::npos; at = reindented.find("\n    ", at + 1))
    reindented.replace(at, 5, "\n\t");
  EXPECT_TRUE(recognize_chat_template(reindented) == ChatTemplateKind::kQwen3);
  EXPECT_TRUE(recognize_chat_template(chat_template_text(ChatTemplateKind::kMistral3) + "\n") ==
              ChatTemplateKind::kMistral3);
  // Dropping one whitespace-control '-' emits a newline before <s>: a different prompt.
  std::string mistral = chat_template_text(ChatTemplateKind::kMistral3);
  mistral.replace(mistral.find("{{- bos_token }}"), 16, "{{ bos_token }}");
  EXPECT_FALSE(recognize_chat_template(mistral).has_value());
  EXPECT_FALSE(recognize_chat_template("{{ messages[0].content }}").has_value());
  EXPECT_FALSE(recognize_chat_template("{% raw %}x{% endraw %}").has_value());
  EXPECT_FALSE(recognize_chat_template("{{ unclosed").has_value());
}

TEST(HfTokenizer, RefusesMissingAndMalformedFiles) {
  test::TempDir tmp;
  const fs::path missing = tmp.path() / "missing";
  fs::create_directories(missing);
  EXPECT_NE(load_error(missing).find((missing / "tokenizer.json").string() + ": missing"), std::string::npos);

  struct Case {
    const char* field;   // what the message names
    std::function<void(json&)> edit;
  };
  const std::vector<Case> cases = {
      {"model.vocab", [](json& j) { j["model"]["vocab"] = json::array({1, 2}); }},
      {"model.vocab['a']", [](json& j) { j["model"]["vocab"]["a"] = "seven"; }},
      {"model.merges[0]", [](json& j) { j["model"]["merges"][0] = 17; }},
      {"model.merges[1]", [](json& j) { j["model"]["merges"][1] = json::array({"zz-not-a-token", "q"}); }},
      {"model.type", [](json& j) { j["model"]["type"] = "Unigram"; }},
      {"model.dropout", [](json& j) { j["model"]["dropout"] = 0.1; }},
      {"pre_tokenizer.pretokenizers[0].pattern.Regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\bword\\b"; }},
      {"pre_tokenizer.pretokenizers[0].behavior",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }},
      {"normalizer.type", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }},
      {"post_processor.type", [](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }},
      {"added_tokens[0].lstrip", [](json& j) { j["added_tokens"][0].erase("lstrip"); }},
      {"added_tokens[0].id", [](json& j) { j["added_tokens"][0]["id"] = -4; }},
      {"pre_tokenizer.pretokenizers", [](json& j) {
         for (int i = 0; i < 65; ++i) j["pre_tokenizer"]["pretokenizers"].push_back(j["pre_tokenizer"]["pretokenizers"][1]);
       }},
      {"post_processor.special_tokens['<s>'].ids",
       [](json& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = std::vector<int>(65, 1); }},
  };
  for (const auto& c : cases) {
    const fs::path dir = tmp.path() / (std::string("case_") + c.field);
    copy_folder(data_dir() / "mistral3", dir);
    json j = read_json(dir / "tokenizer.json");
    c.edit(j);
    write_text(dir / "tokenizer.json", j.dump());
    const std::string err = load_error(dir);
    EXPECT_NE(err.find((dir / "tokenizer.json").string()), std::string::npos) << c.field << ": " << err;
    EXPECT_NE(err.find(c.field), std::string::npos) << c.field << ": " << err;
  }

  // Hostile sizes: a file past the size limit is refused before it is read; a
  // token past the length limit is refused by name.
  const fs::path huge = tmp.path() / "huge";
  copy_folder(data_dir() / "mistral3", huge);
  fs::resize_file(huge / "tokenizer.json", (std::uintmax_t{64} << 20) + 1);  // sparse
  EXPECT_NE(load_error(huge).find("above the limit"), std::string::npos) << load_error(huge);
  const fs::path longtok = tmp.path() / "longtok";
  copy_folder(data_dir() / "mistral3", longtok);
  json lj = read_json(longtok / "tokenizer.json");
  lj["model"]["vocab"][std::string(5000, 'a')] = 7;
  write_text(longtok / "tokenizer.json", lj.dump());
  EXPECT_NE(load_error(longtok).find("model.vocab has a token of 5000 bytes, above the limit"), std::string::npos)
      << load_error(longtok);

  // Not JSON at all; a class transformers rebuilds; disagreeing added-token ids.
  const fs::path junk = tmp.path() / "junk";
  copy_folder(data_dir() / "mistral3", junk);
  write_text(junk / "tokenizer.json", "{\"model\": [1, 2");
  EXPECT_NE(load_error(junk).find((junk / "tokenizer.json").string()), std::string::npos);
  const fs::path llama = tmp.path() / "llama";
  copy_folder(data_dir() / "mistral3", llama);
  json cfg = read_json(llama / "tokenizer_config.json");
  cfg["tokenizer_class"] = "LlamaTokenizerFast";
  write_text(llama / "tokenizer_config.json", cfg.dump());
  EXPECT_NE(load_error(llama).find("tokenizer_class"), std::string::npos) << load_error(llama);
  const fs::path ids = tmp.path() / "ids";
  copy_folder(data_dir() / "qwen3", ids);
  cfg = read_json(ids / "tokenizer_config.json");
  json dec = cfg["added_tokens_decoder"];
  const std::string first = dec.begin().key();
  cfg["added_tokens_decoder"]["999999"] = dec[first];
  cfg["added_tokens_decoder"].erase(first);
  write_text(ids / "tokenizer_config.json", cfg.dump());
  EXPECT_NE(load_error(ids, "Qwen2TokenizerFast").find("transformers gives it id"), std::string::npos)
      << load_error(ids, "Qwen2TokenizerFast");
}

TEST(HfTokenizer, RequestErrors) {
  const HfTokenizer tok = HfTokenizer::load((data_dir() / "mistral3").string(), "PixtralProcessor");
  EXPECT_THROW(tok.encode("\xff\xfe"), RequestError);
  EXPECT_THROW(tok.encode_padded("x", 0), RequestError);
  EXPECT_THROW(tok.encode_chat(flux2_klein_chat("x"), 8), CheckpointError);  // no tokenizer template there
  ChatRequest no_system = flux2_dev_chat("x");
  no_system.system.reset();
  EXPECT_THROW(tok.encode_chat(no_system, 16), RequestError);
}

// ---- pieces --------------------------------------------------------------------

std::vector<std::string> split(const std::string& pattern, const std::string& text) {
  const SplitRegex r = SplitRegex::compile(pattern);
  const std::u32string u = decode_utf8(text, "t");
  std::vector<std::string> out;
  size_t prev = 0;
  for (const auto& [b, e] : r.find_all(u)) {
    if (b > prev) out.push_back(encode_utf8(u.substr(prev, b - prev)));
    out.push_back(encode_utf8(u.substr(b, e - b)));
    prev = e;
  }
  if (prev < u.size()) out.push_back(encode_utf8(u.substr(prev)));
  return out;
}

TEST(SplitRegex, Qwen2AndTekkenPatterns) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(presets::kQwen2SplitPattern, "Hello world's 123  x\n\n y"),
            (V{"Hello", " world", "'s", " ", "1", "2", "3", " ", " x", "\n\n", " y"}));
  EXPECT_EQ(split(presets::kQwen2SplitPattern, "I'M"), (V{"I", "'M"}));
  EXPECT_EQ(split(presets::kQwen2SplitPattern, "x'ſt"), (V{"x", "'ſ", "t"}));  // Oniguruma folds ſ to s
  EXPECT_EQ(split(presets::kQwen2SplitPattern, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(presets::kTekkenSplitPattern, "HelloWORLD Ab"), (V{"Hello", "WORLD", " Ab"}));
  // Literals reach ICU as \x{..}: its \v (a class), set strings {..} and && mean other things.
  EXPECT_EQ(split("[{|}]+", "a{|}b"), (V{"a", "{|}", "b"}));
  EXPECT_EQ(split("\\v", "a\vb\nc"), (V{"a", "\v", "b\nc"}));
  EXPECT_EQ(split("(?i:'s)", "'S'\u017f's"), (V{"'S", "'\u017f", "'s"}));
  // A long run of spaces (ICU's default backtracking stack would overflow).
  EXPECT_EQ(split(presets::kQwen2SplitPattern, std::string(1 << 20, ' ') + "x").size(), 2u);
  for (const char* refused : {"\\h", ".", "^a", "(?<n>a)", "[a&&b]", "(?=a)*", "a**", "(?i:[a])", "(?i:\\s)"})
    EXPECT_THROW(SplitRegex::compile(refused), std::invalid_argument) << refused;
  EXPECT_THROW(SplitRegex::compile("a*?"), std::invalid_argument);
  EXPECT_THROW(SplitRegex::compile("(a*)*"), std::invalid_argument);
  EXPECT_THROW(SplitRegex::compile("\\p{Greek}"), std::invalid_argument);
  EXPECT_THROW(SplitRegex::compile("[a-"), std::invalid_argument);
}

TEST(AddedTokenTrie, LeftmostThenLongestThenFirstAdded) {
  AddedTokenTrie trie;
  trie.add("<s>", 0);
  trie.add("<s>x", 1);
  trie.add("s>", 2);
  trie.add("<s>", 3);  // the first index stays
  auto m = trie.find("ab<s>xy", 0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->begin, 2u);
  EXPECT_EQ(m->end, 6u);
  EXPECT_EQ(m->index, 1);
  m = trie.find("<s>", 0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->index, 0);
  m = trie.find("<s>", 1);  // from inside: "s>" starts there
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->index, 2);
  EXPECT_FALSE(trie.find("<x <", 0).has_value());
  EXPECT_FALSE(AddedTokenTrie().find("<s>", 0).has_value());
}

TEST(BpeMerges, LowestRankFirstLeftmostAmongEqual) {
  BpeMerges merges;
  merges.add(1, 2, 10, 0);  // a b -> ab
  merges.add(10, 3, 11, 1);  // ab c -> abc
  merges.add(2, 3, 12, 2);  // b c -> bc (rank too high to win)
  std::vector<uint32_t> word = {1, 2, 3, 1, 2, 1, 1};
  merges.apply(word);
  EXPECT_EQ(word, (std::vector<uint32_t>{11, 10, 1, 1}));
  merges.add(1, 1, 13, 3);
  word = {1, 1, 1};
  merges.apply(word);  // overlapping pairs: the leftmost merges, the rest stays
  EXPECT_EQ(word, (std::vector<uint32_t>{13, 1}));
}

}  // namespace
}  // namespace tprun::text
