// Attention with the queries in chunks (ModelOptions::attention_chunk):
// nn::attention / nn::sdpa / nn::over_query_chunks against one call on random
// q, k, v (fp32: within 1e-5; a chunk that does not divide the sequence; a
// chunk >= the sequence or 0 is the one call, bitwise), a mask sliced with
// its query rows, the matmul records independent of the chunk, the option's
// bounds, the backend the load logs; then every model with attention, loaded
// in-process with the option on and off (FLUX.1 and FLUX.2 transformers, the
// VAE decoder and encoder, a Qwen3 decoder text encoder with padding and a
// sliding window, T5 and CLIP).
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/tensor_file.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/decoder_text_encoder.h"
#include "models/flux2_transformer.h"
#include "models/flux_transformer.h"
#include "models/init_weights.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/t5_encoder.h"
#include "parallel/matmul_trace.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kTol = 1e-5;  // fp32, chunked vs one call

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return at::abs(a.to(at::kFloat).cpu() - b.to(at::kFloat).cpu()).max().item().toDouble();
}

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor randn(std::vector<int64_t> shape, at::Generator& g) {
  return at::randn(shape, g, at::TensorOptions().dtype(at::kFloat));
}

// ---- nn level ------------------------------------------------------------------------

TEST(AttentionChunk, ChunkedMatchesOneCall) {
  auto g = gen(1);
  // Queries and keys of different lengths (37 queries, 41 keys), [B, H, S, D].
  const at::Tensor q = randn({2, 3, 37, 16}, g), k = randn({2, 3, 41, 16}, g), v = randn({2, 3, 41, 24}, g);
  const at::Tensor plain = nn::attention(q, k, v);
  ASSERT_TRUE(at::equal(plain, at::scaled_dot_product_attention(q, k, v)));
  for (int64_t chunk : {1, 5, 8, 16, 36}) {
    const at::Tensor out = nn::attention(q, k, v, 1, chunk);
    ASSERT_EQ(out.sizes(), plain.sizes());
    const double d = max_abs(out, plain);
    std::printf("  chunk %2lld of 37 queries: max abs diff %.3g\n", static_cast<long long>(chunk), d);
    EXPECT_LE(d, kTol) << "chunk " << chunk;
  }
  // 0, the sequence and more: the one call itself.
  for (int64_t chunk : {0, 37, 38, 1 << 20}) EXPECT_TRUE(at::equal(nn::attention(q, k, v, 1, chunk), plain)) << chunk;
}

TEST(AttentionChunk, ChunkedOutputKeepsTheOneCallLayout) {
  // FLUX's heads are a transposed view of [B, S, H, D]; the joined output is
  // laid out as the kernel's (merge_heads then stays a view).
  auto g = gen(2);
  const at::Tensor q = randn({1, 50, 4, 8}, g).transpose(1, 2), k = randn({1, 50, 4, 8}, g).transpose(1, 2),
                   v = randn({1, 50, 4, 8}, g).transpose(1, 2);
  const at::Tensor plain = nn::attention(q, k, v), out = nn::attention(q, k, v, 1, 7);
  EXPECT_EQ(out.strides(), plain.strides());
  EXPECT_LE(max_abs(out, plain), kTol);
}

TEST(AttentionChunk, MaskRowsGoWithTheirQueries) {
  auto g = gen(3);
  const at::Tensor q = randn({2, 2, 29, 16}, g), k = randn({2, 2, 29, 16}, g), v = randn({2, 2, 29, 16}, g);
  // A random boolean mask [B, 1, S_q, S_k] with the diagonal always visible.
  at::Tensor mask = at::rand({2, 1, 29, 29}, g, at::TensorOptions().dtype(at::kFloat)).gt(0.5);
  mask = mask.logical_or(at::eye(29, at::TensorOptions().dtype(at::kBool)));
  const double scale = 0.3;
  const at::Tensor plain = nn::sdpa(q, k, v, mask, scale);
  ASSERT_TRUE(at::equal(plain, at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale)));
  for (int64_t chunk : {1, 4, 10, 28}) {
    const double d = max_abs(nn::sdpa(q, k, v, mask, scale, chunk), plain);
    std::printf("  masked, chunk %2lld of 29 queries: max abs diff %.3g\n", static_cast<long long>(chunk), d);
    EXPECT_LE(d, kTol) << "chunk " << chunk;
  }
  EXPECT_TRUE(at::equal(nn::sdpa(q, k, v, mask, scale, 29), plain));
  // A mask that broadcasts over the queries goes whole to every chunk.
  const at::Tensor keys_only = mask.select(2, 0).unsqueeze(2);  // [B, 1, 1, S_k]
  EXPECT_LE(max_abs(nn::sdpa(q, k, v, keys_only, scale, 6), nn::sdpa(q, k, v, keys_only, scale)), kTol);
  // An additive float mask too.
  const at::Tensor additive = randn({29, 29}, g);
  EXPECT_LE(max_abs(nn::sdpa(q, k, v, additive, std::nullopt, 3), nn::sdpa(q, k, v, additive)), kTol);
}

TEST(AttentionChunk, OverQueryChunksJoinsAlongTheDim) {
  // An eager attention (T5-like: scores + bias, fp32 softmax) over query chunks on dim 2.
  auto g = gen(4);
  const at::Tensor q = randn({1, 2, 23, 8}, g), k = randn({1, 2, 23, 8}, g), v = randn({1, 2, 23, 8}, g);
  const at::Tensor bias = randn({1, 2, 23, 23}, g);
  std::vector<std::pair<int64_t, int64_t>> calls;
  auto eager = [&](int64_t start, int64_t n) {
    calls.emplace_back(start, n);
    const at::Tensor scores = at::matmul(q.narrow(2, start, n), k.transpose(3, 2)) + bias.narrow(2, start, n);
    return at::matmul(at::softmax(scores, -1), v);
  };
  const at::Tensor plain = nn::over_query_chunks(23, 0, 2, eager);
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{0, 23}}));
  calls.clear();
  const at::Tensor out = nn::over_query_chunks(23, 10, 2, eager);
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {10, 10}, {20, 3}}));
  EXPECT_LE(max_abs(out, plain), kTol);
}

TEST(AttentionChunk, MatmulRecordsDoNotDependOnTheChunk) {
  auto g = gen(5);
  const at::Tensor q = randn({1, 4, 30, 8}, g), k = randn({1, 4, 30, 8}, g), v = randn({1, 4, 30, 8}, g);
  auto record = [&](int64_t chunk) {
    parallel::MatmulRecorder rec;
    nn::attention(q, k, v, 2, chunk);
    return rec.shapes();
  };
  const auto one = record(0), chunked = record(7);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(chunked.size(), one.size());
  double f1 = 0, f2 = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(chunked[i].batch, one[i].batch);
    EXPECT_EQ(chunked[i].m, one[i].m);
    EXPECT_EQ(chunked[i].k, one[i].k);
    EXPECT_EQ(chunked[i].n, one[i].n);
    EXPECT_EQ(chunked[i].tp_share, one[i].tp_share);
    f1 += one[i].flops() * one[i].tp_share;
    f2 += chunked[i].flops() * chunked[i].tp_share;
  }
  EXPECT_EQ(f1, f2);
  EXPECT_EQ(f1, 2.0 * (2.0 * 4 * 30 * 8 * 30) * 2);  // Q K^T and P V, 4 heads, tp share 2
}

TEST(AttentionChunk, OptionBounds) {
  EXPECT_EQ(nn::checked_attention_chunk(0), 0);
  EXPECT_EQ(nn::checked_attention_chunk(1), 1);
  EXPECT_EQ(nn::checked_attention_chunk(nn::kMaxAttentionChunk), nn::kMaxAttentionChunk);
  for (int64_t bad : {int64_t{-1}, int64_t{-4096}, nn::kMaxAttentionChunk + 1}) {
    try {
      nn::checked_attention_chunk(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("attention_chunk = " + std::to_string(bad)), std::string::npos) << what;
      EXPECT_NE(what.find("[1, 16777216]"), std::string::npos) << what;
      EXPECT_TRUE(e.all_ranks());
    }
  }
  // A load refuses it before reading a weight byte.
  std::string cfg_path;
  const fs::path dir = test::data_dir("flux_transformer") / "model";
  ASSERT_TRUE(fs::exists(dir)) << "committed reference data missing: " << dir;
  const json cfg = read_component_config(dir.string(), &cfg_path);
  auto source = checkpoint::open_weight_source(dir.string());
  ModelOptions o;
  o.memory.attention_chunk = -8;
  EXPECT_THROW(FluxTransformer::load(*source, cfg, cfg_path, {}, o), ConfigError);
}

TEST(AttentionChunk, BackendAndPhrases) {
  // libtorch's SDPA on CPU: its flash attention CPU kernel for fp32 / bf16, with or without a mask.
  EXPECT_EQ(nn::sdpa_backend("cpu", at::kFloat, 4, 16, false), "flash attention CPU kernel");
  EXPECT_EQ(nn::sdpa_backend("cpu", at::kBFloat16, 4, 128, true), "flash attention CPU kernel");
  EXPECT_EQ(nn::sdpa_backend("cpu", at::kFloat, 1, 512, false), "flash attention CPU kernel");
  EXPECT_NE(nn::sdpa_backend("no-such-device", at::kFloat, 4, 16, false).find("backend unknown"), std::string::npos);
  EXPECT_EQ(nn::attention_chunk_phrase(0), "one call over all queries");
  EXPECT_EQ(nn::attention_chunk_phrase(4096), "queries in chunks of 4096 tokens");
  EXPECT_EQ(nn::attention_chunk_phrase(1), "queries in chunks of 1 token");
}

// ---- models --------------------------------------------------------------------------

// `dir` loaded through the registry with attention_chunk `chunk`.
std::unique_ptr<Model> load_dir(const fs::path& dir, int64_t chunk, ModelOptions o = {}) {
  std::string cfg_path;
  const json cfg = read_component_config(dir.string(), &cfg_path);
  auto source = checkpoint::open_weight_source(dir.string());
  o.memory.attention_chunk = chunk;
  return load_model(*source, cfg, cfg_path, {}, o);
}

// A folder with `config` and seeded random weights for its table in `file`.
fs::path random_model(const test::TempDir& tmp, const std::string& name, const json& config, const std::string& file) {
  const fs::path dir = tmp.path() / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  const auto table = model_table_for(config, (dir / "config.json").string());
  if (!table) throw std::runtime_error("no model for " + name);
  write_random_weights(*table, 7, (dir / file).string());
  return dir;
}

// Every output of `inputs` through `dir` with the chunks on vs off: within
// kTol for chunks that split the sequence; bitwise for `whole` (>= it).
void expect_chunks_match(const char* what, const std::function<std::unique_ptr<Model>(int64_t)>& load,
                         const TensorMap& inputs, std::vector<int64_t> chunks, int64_t whole, double tol = kTol) {
  const auto plain_model = load(0);
  const TensorMap plain = plain_model->forward(inputs);
  for (int64_t chunk : chunks) {
    const TensorMap out = load(chunk)->forward(inputs);
    for (const auto& [name, t] : plain) {
      const double d = max_abs(out.at(name), t);
      std::printf("  %-28s chunk %3lld: '%s' max abs diff %.3g\n", what, static_cast<long long>(chunk), name.c_str(),
                  d);
      EXPECT_LE(d, tol) << what << " chunk " << chunk << " output " << name;
    }
  }
  const TensorMap same = load(whole)->forward(inputs);
  for (const auto& [name, t] : plain) EXPECT_TRUE(at::equal(same.at(name), t)) << what << " " << name;
}

TEST(AttentionChunkModels, FluxTransformer) {
  const fs::path data = test::data_dir("flux_transformer");
  ASSERT_TRUE(fs::exists(data / "inputs.safetensors"))
      << "committed reference data missing: " << data / "inputs.safetensors";
  const TensorMap inputs = checkpoint::read_tensor_file((data / "inputs.safetensors").string());
  const int64_t tokens = inputs.at("hidden_states").size(1) + inputs.at("encoder_hidden_states").size(1);
  std::printf("  FLUX.1 reference case: %lld joint tokens\n", static_cast<long long>(tokens));
  ASSERT_GT(tokens, 8);
  // The reference output with the chunks on too (the unchunked one is tests/mpi's).
  const at::Tensor expected = checkpoint::read_tensor_file((data / "expected.safetensors").string()).at("sample");
  const auto chunked = load_dir(data / "model", 5);
  EXPECT_EQ(dynamic_cast<const FluxTransformer&>(*chunked).attention_chunk(), 5);
  EXPECT_LE(max_abs(chunked->forward(inputs).at("sample"), expected), 1e-4);
  expect_chunks_match("FluxTransformer2DModel", [&](int64_t c) { return load_dir(data / "model", c); }, inputs,
                      {1, 5, tokens - 1}, tokens);
}

TEST(AttentionChunkModels, Flux2Transformer) {
  test::TempDir tmp;
  const json config = {{"_class_name", "Flux2Transformer2DModel"},
                       {"num_attention_heads", 2},
                       {"attention_head_dim", 16},
                       {"axes_dims_rope", {4, 4, 4, 4}},
                       {"num_layers", 1},
                       {"num_single_layers", 2},
                       {"in_channels", 8},
                       {"joint_attention_dim", 24},
                       {"timestep_guidance_channels", 32},
                       {"mlp_ratio", 2.0},
                       {"guidance_embeds", true}};
  const fs::path dir = random_model(tmp, "transformer", config, "diffusion_pytorch_model.safetensors");
  const auto model = load_dir(dir, 0);
  const TensorMap inputs = model->example_inputs(3);  // 64 image + 8 text tokens
  const int64_t tokens = inputs.at("hidden_states").size(1) + inputs.at("encoder_hidden_states").size(1);
  expect_chunks_match("Flux2Transformer2DModel", [&](int64_t c) { return load_dir(dir, c); }, inputs, {7, 32, 71},
                      tokens);
}

TEST(AttentionChunkModels, VaeDecoderAndEncoder) {
  const fs::path dec = test::data_dir("vae_decoder") / "model";
  const fs::path enc_case = test::data_dir("vae_encoder");
  for (const fs::path& p : {dec, enc_case / "case.json"})
    ASSERT_TRUE(fs::exists(p)) << "committed reference data missing: " << p;
  auto g = gen(6);
  // Latents 9 x 7: 63 mid-block tokens.
  const TensorMap latents = {{"latents", randn({1, 16, 9, 7}, g)}};
  expect_chunks_match("AutoencoderKL decode", [&](int64_t c) { return load_dir(dec, c); }, latents, {4, 10, 62}, 63);

  std::ifstream in(enc_case / "case.json");
  const fs::path enc = enc_case / json::parse(in).at("model").at("dir").get<std::string>();
  const auto probe = load_dir(enc, 0, [] {
    ModelOptions o;
    o.part = "encoder";
    return o;
  }());
  const int64_t sf = dynamic_cast<const AutoencoderKL&>(*probe).config().scale_factor();
  const TensorMap image = {{"image", at::rand({1, 3, 9 * sf, 7 * sf}, g) * 2 - 1}};
  auto load_enc = [&](int64_t c) {
    ModelOptions o;
    o.part = "encoder";
    return load_dir(enc, c, o);
  };
  expect_chunks_match("AutoencoderKL encode", load_enc, image, {4, 10, 62}, 63);
}

TEST(AttentionChunkModels, DecoderTextEncoderWithPaddingAndWindow) {
  test::TempDir tmp;
  const json config = {{"architectures", {"Qwen3ForCausalLM"}},
                       {"model_type", "qwen3"},
                       {"vocab_size", 128},
                       {"hidden_size", 64},
                       {"intermediate_size", 96},
                       {"num_hidden_layers", 3},
                       {"num_attention_heads", 8},
                       {"num_key_value_heads", 2},
                       {"head_dim", 16},
                       {"use_sliding_window", true},
                       {"sliding_window", 5},
                       {"layer_types", {"full_attention", "sliding_attention", "full_attention"}},
                       {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}}};
  const fs::path dir = random_model(tmp, "text_encoder", config, "model.safetensors");
  auto g = gen(8);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  // Batch 2 x 21; the second prompt left-padded by 6 (rows that see no key).
  at::Tensor mask = at::ones({2, 21}, i64);
  mask.select(0, 1).narrow(0, 0, 6).zero_();
  const TensorMap inputs = {{"input_ids", at::randint(128, {2, 21}, g, i64)}, {"attention_mask", mask}};
  expect_chunks_match("Qwen3ForCausalLM", [&](int64_t c) { return load_dir(dir, c); }, inputs, {1, 4, 20}, 21);
}

TEST(AttentionChunkModels, T5AndClip) {
  const fs::path t5 = test::data_dir("t5_encoder") / "text_encoder_2";
  const fs::path clip = test::data_dir("clip_text") / "text_encoder";
  for (const fs::path& p : {t5, clip}) ASSERT_TRUE(fs::exists(p)) << "committed reference data missing: " << p;
  auto g = gen(9);
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  std::string path;
  const int64_t t5_vocab = read_component_config(t5.string(), &path).at("vocab_size").get<int64_t>();
  const TensorMap t5_in = {{"input_ids", at::randint(t5_vocab, {2, 19}, g, i64)}};
  expect_chunks_match("T5EncoderModel", [&](int64_t c) { return load_dir(t5, c); }, t5_in, {1, 4, 18}, 19);
  const json clip_cfg = read_component_config(clip.string(), &path);
  const int64_t len = std::min<int64_t>(13, clip_cfg.at("max_position_embeddings").get<int64_t>());
  const TensorMap clip_in = {{"input_ids", at::randint(clip_cfg.at("vocab_size").get<int64_t>(), {2, len}, g, i64)}};
  expect_chunks_match("CLIPTextModel", [&](int64_t c) { return load_dir(clip, c); }, clip_in, {1, 4, len - 1}, len);
}

}  // namespace
}  // namespace tprun::models
