// `tprun init-model`: the BPE trainer, the SentencePiece-trained T5 tokenizer,
// the tokenizer folders (loaded back by tprun's own CLIP and T5 tokenizers),
// the presets' configs, the random weights and the whole pipeline folder
// (atomic, refuses a non-empty folder without force, same seed = same bytes).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/safetensors_header.h"
#include "models/init_weights.h"
#include "models/model_registry.h"
#include "presets/flux2_presets.h"
#include "presets/flux_presets.h"
#include "presets/pipeline_preset.h"
#include "presets/qwen_image_presets.h"
#include "text/bpe_trainer.h"
#include "text/byte_level.h"
#include "text/clip_text_clean.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"
#include "presets/tokenizer_files.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::TempDir;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const fs::path& p) { return json::parse(read_file(p)); }

// ---- BPE trainer ------------------------------------------------------------------

TEST(BpeTrainer, ByteSymbolsAreOpenaiOrder) {
  const auto s = text::byte_level_symbols();
  ASSERT_EQ(s.size(), 256u);
  EXPECT_EQ(s['!'], "!");
  EXPECT_EQ(s['a'], "a");
  EXPECT_EQ(s[0], "\xc4\x80");       // U+0100
  EXPECT_EQ(s[' '], "\xc4\xa0");     // U+0120 'Ġ'
  EXPECT_EQ(s[0xAD], "\xc5\x83");    // U+0143: the last unprintable byte maps to 256 + 67
  EXPECT_EQ(s[0xE9], "\xc3\xa9");    // printable Latin-1 maps to itself
}

TEST(BpeTrainer, LearnsMostFrequentPairsSmallestFirst) {
  // "aaa" x3 and "ab" x1: (a,a) and (a,a</w>) both occur 3 times; the
  // smaller pair (a,a) wins; then (aa,a</w>) 3 times; (a,b</w>) once stops.
  const auto v = text::train_clip_bpe({"aaa aaa", "AAA ab"}, 10);
  ASSERT_EQ(v.merges.size(), 2u);
  EXPECT_EQ(v.merges[0], std::make_pair(std::string("a"), std::string("a")));
  EXPECT_EQ(v.merges[1], std::make_pair(std::string("aa"), std::string("a</w>")));
  ASSERT_EQ(v.tokens.size(), 512u + 2 + 2);
  EXPECT_EQ(v.tokens[0], "!");
  EXPECT_EQ(v.tokens[256], "!</w>");
  EXPECT_EQ(v.tokens[220], "\xc4\xa0");  // bytes_to_unicode() order: 188 printable bytes, then 0x00..0x20
  EXPECT_EQ(v.tokens[255], "\xc5\x83");
  EXPECT_EQ(v.tokens[512], "aa");
  EXPECT_EQ(v.tokens[513], "aaa</w>");
  EXPECT_EQ(v.tokens[514], "<|startoftext|>");
  EXPECT_EQ(v.tokens[515], "<|endoftext|>");
  // The limit is honoured.
  EXPECT_EQ(text::train_clip_bpe({"aaa aaa", "AAA ab"}, 1).merges.size(), 1u);
  EXPECT_THROW(text::train_clip_bpe({"x"}, -1), ConfigError);
  EXPECT_THROW(text::train_clip_bpe({"bad \xff"}, 5), RequestError);
}

TEST(BpeTrainer, EveryTokenHasOneIdAndCorpusIsDeterministic) {
  const auto a = text::train_clip_bpe(presets::bundled_corpus(), 1000);
  const auto b = text::train_clip_bpe(presets::bundled_corpus(), 1000);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_GT(a.merges.size(), 300u) << "the bundled corpus should support a few hundred merges";
  std::set<std::string> seen(a.tokens.begin(), a.tokens.end());
  EXPECT_EQ(seen.size(), a.tokens.size());
}

// ---- tokenizer folders, loaded by tprun's tokenizers ---------------------------------

class TokenizerFolders : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const auto& corpus = presets::bundled_corpus();
    bpe_ = new text::BpeVocabulary(text::train_clip_bpe(corpus, 1000));
    clip_size_ = presets::write_clip_tokenizer((dir_->path() / "tokenizer").string(), *bpe_);
    t5_ = new presets::T5Vocabulary(presets::train_t5_sentencepiece(corpus, 500));
    t5_length_ = presets::write_t5_tokenizer((dir_->path() / "tokenizer_2").string(), *t5_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete bpe_;
    delete t5_;
  }
  static TempDir* dir_;
  static text::BpeVocabulary* bpe_;
  static presets::T5Vocabulary* t5_;
  static int64_t clip_size_, t5_length_;
};
TempDir* TokenizerFolders::dir_ = nullptr;
text::BpeVocabulary* TokenizerFolders::bpe_ = nullptr;
presets::T5Vocabulary* TokenizerFolders::t5_ = nullptr;
int64_t TokenizerFolders::clip_size_ = 0;
int64_t TokenizerFolders::t5_length_ = 0;

TEST_F(TokenizerFolders, ClipFilesHaveFluxLayout) {
  const fs::path d = dir_->path() / "tokenizer";
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"})
    EXPECT_TRUE(fs::is_regular_file(d / f)) << f;
  const json vocab = read_json(d / "vocab.json");
  EXPECT_EQ(static_cast<int64_t>(vocab.size()), clip_size_);
  EXPECT_EQ(vocab["<|startoftext|>"], clip_size_ - 2);
  EXPECT_EQ(vocab["<|endoftext|>"], clip_size_ - 1);
  EXPECT_EQ(vocab["a</w>"], 256 + 'a' - '!');
  const std::string merges = read_file(d / "merges.txt");
  EXPECT_EQ(merges.rfind("#version: 0.2\n", 0), 0u);
  EXPECT_EQ(std::count(merges.begin(), merges.end(), '\n'), static_cast<long>(bpe_->merges.size() + 1));
  const json config = read_json(d / "tokenizer_config.json");
  EXPECT_EQ(config["model_max_length"], 77);
  EXPECT_EQ(config["pad_token"], "<|endoftext|>");
  EXPECT_EQ(config["added_tokens_decoder"][std::to_string(clip_size_ - 1)]["content"], "<|endoftext|>");
}

TEST_F(TokenizerFolders, ClipTokenizerLoadsAndRoundTrips) {
  const text::ClipTokenizer tok((dir_->path() / "tokenizer").string());
  EXPECT_EQ(static_cast<int64_t>(tok.vocab_size()), clip_size_);
  EXPECT_EQ(tok.bos_id(), clip_size_ - 2);
  EXPECT_EQ(tok.eos_id(), clip_size_ - 1);
  EXPECT_EQ(tok.pad_id(), clip_size_ - 1);
  const auto out = tok.encode("A photo of a cat sitting on a windowsill");
  ASSERT_EQ(out.input_ids.size(), 77u);
  EXPECT_EQ(out.input_ids.front(), clip_size_ - 2);
  // Frequent corpus words are single tokens.
  for (const char* w : {"a", "of", "the", "and", "with", "in", "photo"})
    EXPECT_EQ(tok.content_ids(w).size(), 1u) << w;
  size_t ids = 0, bytes = 0;
  for (const auto& line : presets::bundled_corpus()) {
    ids += tok.content_ids(line).size();
    bytes += line.size();
  }
  EXPECT_LT(ids * 2, bytes) << "merges should compress the corpus well below a token per byte";
  // Decoding the ids of every corpus line gives its words back.
  for (const auto& line : presets::bundled_corpus()) {
    std::string decoded;
    for (int64_t id : tok.content_ids(line)) decoded += bpe_->tokens[static_cast<size_t>(id)];
    std::string expected;
    for (const auto& w : text::clip_pretokenize(text::clip_basic_clean(line))) {
      for (unsigned char b : w) expected += text::byte_level_symbols()[b];
      expected += "</w>";
    }
    EXPECT_EQ(decoded, expected) << line;
  }
}

TEST_F(TokenizerFolders, T5ModelIsSentencePieceUnigram) {
  ASSERT_GE(t5_->pieces.size(), 100u);
  EXPECT_LE(t5_->pieces.size(), 500u);
  EXPECT_EQ(t5_->pieces[0].first, "<pad>");
  EXPECT_EQ(t5_->pieces[1].first, "</s>");
  EXPECT_EQ(t5_->pieces[2].first, "<unk>");
  EXPECT_FALSE(t5_->precompiled_charsmap.empty()) << "nmt_nfkc carries a precompiled map";
  // Same text, same model, byte for byte.
  EXPECT_EQ(presets::train_t5_sentencepiece(presets::bundled_corpus(), 500).model_proto, t5_->model_proto);
  EXPECT_EQ(t5_length_, static_cast<int64_t>(t5_->pieces.size()) + 100);
}

TEST_F(TokenizerFolders, T5TokenizerLoadsWithExtraIds) {
  const fs::path d = dir_->path() / "tokenizer_2";
  for (const char* f : {"spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    EXPECT_TRUE(fs::is_regular_file(d / f)) << f;
  const text::T5Tokenizer tok(d.string());
  EXPECT_EQ(tok.vocab_size(), t5_length_);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.unk_id(), 2);
  const auto ids = tok.content_ids("A photo of a cat, highly detailed. <extra_id_0>");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), t5_length_ - 1);  // <extra_id_0> is the last id
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_NE(ids[i], tok.unk_id()) << "position " << i;
  const json config = read_json(d / "tokenizer_config.json");
  EXPECT_EQ(config["extra_ids"], 100);
  EXPECT_EQ(config["legacy"], true);
  EXPECT_EQ(config["model_max_length"], 512);
  EXPECT_EQ(config["added_tokens_decoder"][std::to_string(t5_length_ - 100)]["content"], "<extra_id_99>");
  // tokenizer.json: the Unigram vocabulary = pieces + extra ids, nmt_nfkc's map.
  const json fast = read_json(d / "tokenizer.json");
  EXPECT_EQ(fast["model"]["type"], "Unigram");
  EXPECT_EQ(static_cast<int64_t>(fast["model"]["vocab"].size()), t5_length_);
  EXPECT_EQ(fast["model"]["vocab"][t5_length_ - 1][0], "<extra_id_0>");
  EXPECT_EQ(fast["normalizer"]["precompiled_charsmap"], presets::base64_encode(t5_->precompiled_charsmap));
}

TEST(TokenizerFiles, Base64AndProtobufField) {
  EXPECT_EQ(presets::base64_encode(""), "");
  EXPECT_EQ(presets::base64_encode("f"), "Zg==");
  EXPECT_EQ(presets::base64_encode("fo"), "Zm8=");
  EXPECT_EQ(presets::base64_encode("foo"), "Zm9v");
  EXPECT_EQ(presets::base64_encode("foobar"), "Zm9vYmFy");
  // field 3 (normalizer_spec) { field 1 "n", field 2 "xyz" }, after a varint field 7.
  const std::string proto = std::string("\x38\x96\x01", 3) + "\x1a\x08" + "\x0a\x01n" + "\x12\x03xyz";
  EXPECT_EQ(presets::spm_precompiled_charsmap(proto, "test"), "xyz");
  EXPECT_THROW(presets::spm_precompiled_charsmap("\x1a\x09\x0a", "test"), CheckpointError);
}

// ---- presets and random weights ---------------------------------------------------

TEST(FluxPresets, ConfigsFitTogether) {
  for (const auto& name : presets::flux_preset_names()) {
    SCOPED_TRACE(name);
    const auto p = presets::flux_preset(name);
    const auto c = presets::flux_pipeline_preset(p, 1500, 600);
    EXPECT_EQ(c.config("transformer")["in_channels"], 4 * c.config("vae")["latent_channels"].get<int64_t>());
    EXPECT_EQ(c.config("transformer")["pooled_projection_dim"], c.config("text_encoder")["hidden_size"]);
    EXPECT_EQ(c.config("transformer")["joint_attention_dim"], c.config("text_encoder_2")["d_model"]);
    EXPECT_EQ(c.config("text_encoder")["vocab_size"], 1500);
    EXPECT_EQ(c.config("text_encoder_2")["vocab_size"], 640);  // 600 rounded up to a multiple of 64
    EXPECT_EQ(c.config("vae")["block_out_channels"].size(), 4u);  // vae scale factor 8
    EXPECT_EQ(c.model_index()["tokenizer_2"], json::array({"transformers", "T5TokenizerFast"}));
    EXPECT_EQ(c.model_index()["image_encoder"], json::array({nullptr, nullptr}));
    EXPECT_EQ(c.config("text_encoder")["architectures"], json::array({"CLIPTextModel"}));
    EXPECT_EQ(c.scheduler["use_dynamic_shifting"], true);
  }
  EXPECT_EQ(presets::flux_preset("small").num_attention_heads * presets::flux_preset("small").attention_head_dim, 256);
  EXPECT_THROW(presets::flux_preset("huge"), ConfigError);
}

TEST(FluxPresets, MismatchesAreConfigErrors) {
  auto c = presets::flux_pipeline_preset(presets::flux_preset("tiny"), 1500, 600);
  auto expect_error = [&](const presets::PipelinePreset& bad, const std::string& field) {
    try {
      presets::check_flux_pipeline_preset(bad, 1500, 600);
      ADD_FAILURE() << "no error for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  auto bad = c;
  bad.config("transformer")["pooled_projection_dim"] = 48;
  expect_error(bad, "pooled_projection_dim");
  bad = c;
  bad.config("text_encoder_2")["d_model"] = 64;
  expect_error(bad, "joint_attention_dim");
  bad = c;
  bad.config("text_encoder_2")["vocab_size"] = 512;
  expect_error(bad, "vocab_size");
  bad = c;
  bad.config("vae")["norm_num_groups"] = 3;
  expect_error(bad, "norm_num_groups");
  bad = c;
  bad.config("transformer")["axes_dims_rope"] = json::array({4, 4, 4});
  expect_error(bad, "axes_dims_rope");
}

// model_index.json follows from the components' configs (library and class),
// the tokenizers and the family's own entries; an unknown component is a
// ConfigError naming it.
TEST(PipelinePreset, ModelIndexFollowsFromTheComponents) {
  const auto klein = presets::flux2_pipeline_preset(presets::flux2_preset("flux2-klein", "tiny"), 1000);
  EXPECT_EQ(klein.model_index(), json({{"_class_name", "Flux2KleinPipeline"},
                                       {"_diffusers_version", presets::kDiffusersVersion},
                                       {"is_distilled", false},
                                       {"scheduler", json::array({"diffusers", "FlowMatchEulerDiscreteScheduler"})},
                                       {"text_encoder", json::array({"transformers", "Qwen3ForCausalLM"})},
                                       {"tokenizer", json::array({"transformers", "Qwen2TokenizerFast"})},
                                       {"transformer", json::array({"diffusers", "Flux2Transformer2DModel"})},
                                       {"vae", json::array({"diffusers", "AutoencoderKLFlux2"})}}));
  const auto qwen = presets::qwen_image_pipeline_preset(presets::qwen_image_preset("tiny"), 1000);
  const json index = qwen.model_index();
  EXPECT_EQ(index["text_encoder"], json::array({"transformers", "Qwen2_5_VLForConditionalGeneration"}));
  EXPECT_EQ(index["tokenizer"], json::array({"transformers", "Qwen2Tokenizer"}));
  EXPECT_EQ(index.count("is_distilled"), 0u);
  // Qwen-Image's scheduler: its own shift over the flow-match defaults.
  EXPECT_EQ(qwen.scheduler["max_image_seq_len"], 8192);
  EXPECT_EQ(qwen.scheduler["shift_terminal"], 0.02);
  EXPECT_EQ(qwen.scheduler["base_shift"], 0.5);
  EXPECT_EQ(qwen.config("vae")["_class_name"], "AutoencoderKLQwenImage");
  try {
    (void)qwen.config("text_encoder_2");
    ADD_FAILURE() << "no error for a component the preset does not have";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("text_encoder_2"), std::string::npos) << e.what();
  }
}

// Every family has "tiny" (its defaults) and "small"; an unknown name is one
// ConfigError naming both.
TEST(PipelinePreset, TinyAndSmallForEveryFamily) {
  EXPECT_EQ(presets::qwen_image_preset("tiny").num_layers, 2);
  EXPECT_EQ(presets::qwen_image_preset("small").num_layers, 4);
  EXPECT_EQ(presets::qwen_image_preset("small").name, "small");
  EXPECT_EQ(presets::flux2_preset("flux2-dev", "small").text_layers, 31);  // the arch's own default stays
  EXPECT_EQ(presets::flux2_preset("flux2-klein", "small").merges, 3000);
  for (const auto& f : std::vector<std::function<void()>>{[] { presets::flux_preset("huge"); },
                                                          [] { presets::flux2_preset("flux2-klein", "huge"); },
                                                          [] { presets::qwen_image_preset("huge"); }}) {
    try {
      f();
      ADD_FAILURE() << "no error for an unknown preset";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("unknown preset 'huge'; choose one of: tiny, small"), std::string::npos)
          << e.what();
    }
  }
}

// The tokenizer folders are the family's to write first: a preset whose
// tokenizer folder is missing writes nothing.
TEST(PipelinePreset, RefusesAFolderWithoutItsTokenizers) {
  TempDir tmp;
  presets::InitModelSummary summary;
  const auto qwen = presets::qwen_image_pipeline_preset(presets::qwen_image_preset("tiny"), 1000);
  EXPECT_THROW(presets::write_pipeline_preset(tmp.path(), qwen, 0, summary), ConfigError);
  EXPECT_FALSE(fs::exists(tmp.path() / "model_index.json"));
  EXPECT_EQ(summary.tensors, 0);
}

models::TensorSpec spec(const std::string& name, std::vector<int64_t> shape, bool optional = false,
                        models::TensorKind kind = models::TensorKind::Linear) {
  models::TensorSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.optional = optional;
  s.kind = kind;
  return s;
}

TEST(InitWeights, RulesByKindAndShape) {
  using models::init_distribution;
  auto std_of = [](const models::TensorSpec& s) { return init_distribution(s).std; };
  auto mean_of = [](const models::TensorSpec& s) { return init_distribution(s).mean; };
  EXPECT_DOUBLE_EQ(std_of(spec("a.to_q.weight", {64, 256})), 1.0 / 16);
  EXPECT_DOUBLE_EQ(std_of(spec("a.proj.weight", {64, 4})), 0.2);       // clamped up
  EXPECT_DOUBLE_EQ(std_of(spec("a.proj.weight", {64, 10000})), 0.02);  // clamped down
  EXPECT_DOUBLE_EQ(std_of(spec("conv_in.weight", {8, 4, 3, 3})), 1.0 / 6);  // fan_in = 4*3*3
  using models::TensorKind;
  EXPECT_DOUBLE_EQ(std_of(spec("x.to_q.bias", {64}, false, TensorKind::Bias)), 0.05);
  EXPECT_DOUBLE_EQ(mean_of(spec("x.to_q.bias", {64}, false, TensorKind::Bias)), 0.0);
  EXPECT_DOUBLE_EQ(mean_of(spec("encoder.layers.0.layer_norm1.weight", {64}, false, TensorKind::Norm)), 1.0);
  EXPECT_DOUBLE_EQ(std_of(spec("attn.norm_q.weight", {16}, false, TensorKind::Norm)), 0.1);
  EXPECT_DOUBLE_EQ(std_of(spec("text_model.embeddings.token_embedding.weight", {900, 32}, false,
                               TensorKind::Embedding)),
                   0.02);
  EXPECT_DOUBLE_EQ(std_of(spec("shared.weight", {704, 32}, false, TensorKind::Embedding)), 0.02);
  // The kinds come from the model's own declarations:
  const auto t5 = models::model_table_for(
      {{"architectures", {"T5EncoderModel"}}, {"d_model", 32}, {"num_layers", 1}, {"num_heads", 4}, {"d_kv", 8},
       {"d_ff", 64}, {"vocab_size", 704}, {"feed_forward_proj", "gated-gelu"}},
      "t5/config.json");
  EXPECT_DOUBLE_EQ(std_of(*t5->find("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")), 0.02);
  EXPECT_DOUBLE_EQ(std_of(*t5->find("shared.weight")), 0.02);
  EXPECT_DOUBLE_EQ(mean_of(*t5->find("encoder.final_layer_norm.weight")), 1.0);
  // A Linear inside an "embedder" is not an embedding table.
  EXPECT_DOUBLE_EQ(std_of(spec("time_text_embed.timestep_embedder.linear_1.weight", {32, 256})), 1.0 / 16);
}

TEST(InitWeights, SeededNormalsWithTheRightMoments) {
  models::ModelTable table;
  table.cls = "Test";
  table.tensors = {spec("lin.weight", {128, 256}), spec("lin.bias", {4001}, false, models::TensorKind::Bias),
                   spec("norm.weight", {4001}, false, models::TensorKind::Norm),
                   spec("extra.weight", {3, 3}, /*optional=*/true)};
  table.tensors.back().saved = false;  // e.g. a tied copy
  const auto a = models::random_tensors(table, 7), b = models::random_tensors(table, 7),
             c = models::random_tensors(table, 8);
  ASSERT_EQ(a.size(), 3u);  // the tensor save_pretrained does not write is not written
  EXPECT_EQ(a[0].values, b[0].values);
  EXPECT_NE(a[0].values, c[0].values);
  auto moments = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += static_cast<double>(x) * x;
    }
    const double mean = s / v.size();
    return std::make_pair(mean, std::sqrt(s2 / v.size() - mean * mean));
  };
  auto [m0, s0] = moments(a[0].values);
  EXPECT_NEAR(m0, 0.0, 0.002);
  EXPECT_NEAR(s0, 1.0 / 16, 0.002);
  auto [m1, s1] = moments(a[1].values);  // odd length: the last value is filled too
  EXPECT_NEAR(m1, 0.0, 0.005);
  EXPECT_NEAR(s1, 0.05, 0.003);
  EXPECT_NE(a[1].values.back(), 0.0f);
  auto [m2, s2] = moments(a[2].values);
  EXPECT_NEAR(m2, 1.0, 0.01);
  EXPECT_NEAR(s2, 0.1, 0.005);
  EXPECT_NE(models::component_seed(0, "vae"), models::component_seed(0, "transformer"));
  EXPECT_NE(models::component_seed(0, "vae"), models::component_seed(1, "vae"));
}

// ---- the whole folder ---------------------------------------------------------------

TEST(InitModel, TinyFolderIsCompleteAndLoadable) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "flux-tiny";
  const auto summary = presets::write_flux_pipeline(dir.string(), presets::flux_preset("tiny"), 0, false);
  EXPECT_GT(summary.tensors, 0);
  // Nothing left next to it.
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);

  const auto folder = checkpoint::open_pipeline_folder(dir.string());
  EXPECT_EQ(folder.cls, "FluxPipeline");
  const json index = read_json(dir / "model_index.json");
  EXPECT_EQ(index["_diffusers_version"], "0.40.0");
  EXPECT_EQ(read_json(dir / "scheduler" / "scheduler_config.json")["shift"], 3.0);

  // Every component's weights match its table (names, shapes, F32, format pt).
  const std::pair<const char*, const char*> components[] = {
      {"transformer", "diffusion_pytorch_model.safetensors"},
      {"vae", "diffusion_pytorch_model.safetensors"},
      {"text_encoder", "model.safetensors"},
      {"text_encoder_2", "model.safetensors"}};
  for (const auto& [name, file] : components) {
    SCOPED_TRACE(name);
    const fs::path config_path = dir / name / "config.json";
    const auto table = models::model_table_for(read_json(config_path), config_path.string());
    ASSERT_TRUE(table.has_value());
    const auto header = checkpoint::read_safetensors_header((dir / name / file).string());
    EXPECT_EQ(header.metadata.at("format"), "pt");
    size_t required = 0;
    for (const auto& t : table->tensors) {
      if (t.optional) continue;
      ++required;
      const auto* e = header.find(t.name);
      ASSERT_NE(e, nullptr) << t.name;
      EXPECT_EQ(e->shape, t.shape) << t.name;
      EXPECT_EQ(e->dtype, checkpoint::Dtype::F32);
    }
    EXPECT_EQ(header.tensors.size(), required);
  }
  const json t5 = read_json(dir / "text_encoder_2" / "config.json");
  EXPECT_GE(t5["vocab_size"].get<int64_t>(), summary.t5_tokenizer_length);
  const auto t5_header = checkpoint::read_safetensors_header((dir / "text_encoder_2" / "model.safetensors").string());
  EXPECT_NE(t5_header.find("shared.weight"), nullptr);
  EXPECT_EQ(t5_header.find("encoder.embed_tokens.weight"), nullptr);

  // The tokenizers load.
  const text::ClipTokenizer clip((dir / "tokenizer").string());
  EXPECT_EQ(static_cast<int64_t>(clip.vocab_size()), read_json(dir / "text_encoder" / "config.json")["vocab_size"]);
  const text::T5Tokenizer t5tok((dir / "tokenizer_2").string());
  EXPECT_EQ(t5tok.vocab_size(), summary.t5_tokenizer_length);

  // Same seed, same bytes; another seed, other weights.
  const fs::path again = tmp.path() / "again", other = tmp.path() / "other";
  presets::write_flux_pipeline(again.string(), presets::flux_preset("tiny"), 0, false);
  presets::write_flux_pipeline(other.string(), presets::flux_preset("tiny"), 1, false);
  for (const char* f : {"transformer/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                        "text_encoder/model.safetensors", "text_encoder_2/model.safetensors",
                        "tokenizer/vocab.json", "tokenizer_2/spiece.model", "tokenizer_2/tokenizer.json"}) {
    EXPECT_EQ(read_file(dir / f), read_file(again / f)) << f;
  }
  EXPECT_NE(read_file(dir / "transformer/diffusion_pytorch_model.safetensors"),
            read_file(other / "transformer/diffusion_pytorch_model.safetensors"));
}

TEST(InitModel, RefusesNonEmptyFolderUnlessForced) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "taken";
  fs::create_directories(dir);
  std::ofstream(dir / "keep.txt") << "mine";
  try {
    presets::write_flux_pipeline(dir.string(), presets::flux_preset("tiny"), 0, false);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(dir / "keep.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);

  // A file is never replaced.
  std::ofstream(tmp.path() / "file") << "x";
  EXPECT_THROW(presets::write_flux_pipeline((tmp.path() / "file").string(), presets::flux_preset("tiny"), 0, true),
               ConfigError);

  // An empty folder is fine; --force replaces a full one.
  fs::create_directories(tmp.path() / "empty");
  presets::write_flux_pipeline((tmp.path() / "empty").string(), presets::flux_preset("tiny"), 0, false);
  EXPECT_TRUE(fs::is_regular_file(tmp.path() / "empty" / "model_index.json"));
  presets::write_flux_pipeline(dir.string() + "/", presets::flux_preset("tiny"), 0, true);
  EXPECT_FALSE(fs::exists(dir / "keep.txt"));
  EXPECT_TRUE(fs::is_regular_file(dir / "model_index.json"));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 3);  // taken, file, empty
}

}  // namespace
}  // namespace tprun
