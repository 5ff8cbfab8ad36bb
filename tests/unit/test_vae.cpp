// diffusers' AutoencoderKL (FLUX.1-style: 16 latent channels, no quant convs)
// against the reference decode and encode (tests/data/vae_decoder,
// tests/data/vae_encoder, from shared/ref): outputs and every debug
// intermediate within 1e-4; the tensor table equals the checkpoint; a wrong
// shape is refused before any weight byte is read; bf16 with and without
// force_upcast; bad inputs are RequestErrors naming the input.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/tensor_file.h"
#include "models/autoencoder_kl.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "runtime/error.h"
#include "test_data.h"

// (A namespace of its own: the fixture `Vae` would clash with models::Vae.)
namespace tprun::models::vae_test {
namespace {

namespace fs = std::filesystem;
constexpr double kTol = 1e-4;

fs::path decoder_dir() { return test::data_dir("vae_decoder"); }
fs::path encoder_dir() { return test::data_dir("vae_encoder"); }

// The encoder case names its model folder relative to itself (case.json -> model.dir).
fs::path encoder_model_dir() {
  std::ifstream in(encoder_dir() / "case.json");
  const auto j = nlohmann::json::parse(in);
  return encoder_dir() / j.at("model").at("dir").get<std::string>();
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return at::abs(a.to(at::kFloat).cpu() - b.to(at::kFloat).cpu()).max().item().toDouble();
}

std::unique_ptr<AutoencoderKL> load_vae(const fs::path& dir, const ModelOptions& opts = {}) {
  std::string cfg_path;
  auto cfg = read_component_config(dir.string(), &cfg_path);
  auto source = checkpoint::open_weight_source(dir.string());
  return AutoencoderKL::load(*source, cfg, cfg_path, {}, opts);
}

// Every debug tensor of `case_dir` matches the trace entry of the same name.
void expect_trace_matches(const Trace& trace, const fs::path& case_dir) {
  auto debug = checkpoint::read_tensor_file((case_dir / "debug.safetensors").string());
  size_t compared = 0;
  for (const auto& [name, ref] : debug) {
    const at::Tensor* mine = nullptr;
    for (const auto& [n, t] : trace)
      if (n == name) mine = &t;
    ASSERT_NE(mine, nullptr) << "trace lacks '" << name << "'";
    ASSERT_EQ(mine->sizes(), ref.sizes()) << name;
    const double d = max_abs(*mine, ref);
    std::printf("  %-26s max abs diff %.3g\n", name.c_str(), d);
    EXPECT_LE(d, kTol) << name;
    ++compared;
  }
  EXPECT_EQ(compared, debug.size());
  EXPECT_GE(compared, 6u);
}

class Vae : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const fs::path& p : {decoder_dir() / "expected.safetensors", encoder_dir() / "expected.safetensors"})
      ASSERT_TRUE(fs::exists(p)) << "committed reference data missing: " << p;
  }
};

TEST_F(Vae, ConfigFromJson) {
  std::string cfg_path;
  const auto cfg = VaeConfig::from_json(read_component_config(decoder_dir() / "model", &cfg_path), cfg_path);
  EXPECT_EQ(cfg.block_out_channels, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(cfg.latent_channels, 16);
  EXPECT_EQ(cfg.layers_per_block, 1);
  EXPECT_EQ(cfg.norm_num_groups, 8);
  EXPECT_FALSE(cfg.use_quant_conv);
  EXPECT_FALSE(cfg.use_post_quant_conv);
  EXPECT_TRUE(cfg.mid_block_add_attention);
  EXPECT_TRUE(cfg.has_shift);
  EXPECT_DOUBLE_EQ(cfg.shift_factor, 0.1159);
  EXPECT_DOUBLE_EQ(cfg.scaling_factor, 0.3611);
  EXPECT_TRUE(cfg.force_upcast);
  EXPECT_EQ(cfg.scale_factor(), 2);

  nlohmann::json c = {{"_class_name", "AutoencoderKL"}, {"shift_factor", nullptr}};
  const auto d = VaeConfig::from_json(c, "c.json");  // diffusers' defaults
  EXPECT_FALSE(d.has_shift);
  EXPECT_EQ(d.shift_factor, 0.0);
  EXPECT_EQ(d.block_out_channels, (std::vector<int64_t>{64}));
  EXPECT_EQ(d.scale_factor(), 1);

  c["block_out_channels"] = {32, 64};  // block type lists default to one entry
  EXPECT_THROW(VaeConfig::from_json(c, "c.json"), CheckpointError);
  c["down_block_types"] = {"DownEncoderBlock2D", "DownEncoderBlock2D"};
  c["up_block_types"] = {"UpDecoderBlock2D", "AttnUpDecoderBlock2D"};
  try {
    VaeConfig::from_json(c, "c.json");
    ADD_FAILURE() << "unsupported up block accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("AttnUpDecoderBlock2D"), std::string::npos) << e.what();
  }
  c["up_block_types"] = {"UpDecoderBlock2D", "UpDecoderBlock2D"};
  c["norm_num_groups"] = 24;  // does not divide 32
  EXPECT_THROW(VaeConfig::from_json(c, "c.json"), CheckpointError);
}

// The table lists exactly the checkpoint's tensors with the stored shapes.
TEST_F(Vae, TableMatchesCheckpoint) {
  std::string cfg_path;
  const auto cfg = read_component_config(decoder_dir() / "model", &cfg_path);
  auto table = model_table_for(cfg, cfg_path);
  ASSERT_TRUE(table);
  EXPECT_EQ(table->cls, "AutoencoderKL");
  auto source = checkpoint::open_weight_source((decoder_dir() / "model").string());
  const auto names = source->tensor_names();
  ASSERT_EQ(table->tensors.size(), names.size());
  int64_t params = 0;
  for (const auto& spec : table->tensors) {
    ASSERT_TRUE(source->contains(spec.name)) << spec.name;
    EXPECT_EQ(source->describe(spec.name).shape, spec.shape) << spec.name;
    EXPECT_EQ(spec.style, checkpoint::ShardStyle::Replicated);
    int64_t n = 1;
    for (int64_t s : spec.shape) n *= s;
    params += n;
  }
  EXPECT_EQ(params, 178259);  // case.json num_parameters

  // quant convs and no attention, as config flags say.
  auto c2 = cfg;
  c2["use_quant_conv"] = true;
  c2["use_post_quant_conv"] = true;
  c2["mid_block_add_attention"] = false;
  auto t2 = model_table_for(c2, cfg_path);
  ASSERT_TRUE(t2);
  ASSERT_NE(t2->find("quant_conv.weight"), nullptr);
  EXPECT_EQ(t2->find("quant_conv.weight")->shape, (std::vector<int64_t>{32, 32, 1, 1}));
  ASSERT_NE(t2->find("post_quant_conv.bias"), nullptr);
  EXPECT_EQ(t2->find("post_quant_conv.weight")->shape, (std::vector<int64_t>{16, 16, 1, 1}));
  EXPECT_EQ(t2->find("decoder.mid_block.attentions.0.to_q.weight"), nullptr);
  EXPECT_EQ(t2->tensors.size(), names.size() + 4 - 2 * 10);
}

TEST_F(Vae, DecoderMatchesDiffusers) {
  const auto vae = load_vae(decoder_dir() / "model");
  EXPECT_GT(vae->bytes_loaded(), 0u);
  EXPECT_FALSE(vae->upcast());
  auto inputs = checkpoint::read_tensor_file((decoder_dir() / "inputs.safetensors").string());
  auto expected = checkpoint::read_tensor_file((decoder_dir() / "expected.safetensors").string()).at("sample");
  Trace trace;
  const at::Tensor sample = vae->decode(inputs.at("latents"), &trace);
  ASSERT_EQ(sample.sizes(), expected.sizes());
  EXPECT_EQ(sample.scalar_type(), at::kFloat);
  const double d = max_abs(sample, expected);
  std::printf("  %-26s max abs diff %.3g\n", "sample", d);
  EXPECT_LE(d, kTol);
  expect_trace_matches(trace, decoder_dir());
}

TEST_F(Vae, EncoderMatchesDiffusers) {
  const auto vae = load_vae(encoder_model_dir());
  auto inputs = checkpoint::read_tensor_file((encoder_dir() / "inputs.safetensors").string());
  auto expected = checkpoint::read_tensor_file((encoder_dir() / "expected.safetensors").string());
  Trace trace;
  const TensorMap dist = vae->encode(inputs.at("image"), &trace);
  for (const char* name : {"mean", "std"}) {
    ASSERT_TRUE(dist.count(name)) << name;
    ASSERT_EQ(dist.at(name).sizes(), expected.at(name).sizes()) << name;
    const double d = max_abs(dist.at(name), expected.at(name));
    std::printf("  %-26s max abs diff %.3g\n", name, d);
    EXPECT_LE(d, kTol) << name;
  }
  expect_trace_matches(trace, encoder_dir());
}

TEST_F(Vae, LoadsOnlyTheRequestedHalf) {
  const auto full = load_vae(decoder_dir() / "model");
  ModelOptions dec_only;
  dec_only.part = "decoder";
  const auto dec = load_vae(decoder_dir() / "model", dec_only);
  EXPECT_TRUE(dec->has_decoder());
  EXPECT_FALSE(dec->has_encoder());
  EXPECT_LT(dec->bytes_loaded(), full->bytes_loaded());
  EXPECT_THROW(dec->encode(at::zeros({1, 3, 16, 16})), ConfigError);
  auto z = checkpoint::read_tensor_file((decoder_dir() / "inputs.safetensors").string()).at("latents");
  EXPECT_TRUE(at::equal(dec->decode(z), full->decode(z)));

  ModelOptions enc_only;
  enc_only.part = "encoder";
  const auto enc = load_vae(decoder_dir() / "model", enc_only);
  EXPECT_THROW(enc->decode(z), ConfigError);
  EXPECT_EQ(enc->bytes_loaded() + dec->bytes_loaded(), full->bytes_loaded());
}

TEST_F(Vae, BadInputsNameTheInput) {
  const auto vae = load_vae(decoder_dir() / "model");
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const RequestError& e) {
      return e.what();
    }
    return "";
  };
  const std::string wrong_ch = message([&] { vae->decode(at::zeros({1, 4, 8, 8})); });
  EXPECT_NE(wrong_ch.find("'z'"), std::string::npos) << wrong_ch;
  EXPECT_NE(wrong_ch.find("[B, 16, H, W]"), std::string::npos) << wrong_ch;
  EXPECT_NE(wrong_ch.find("[1, 4, 8, 8]"), std::string::npos) << wrong_ch;
  EXPECT_NE(message([&] { vae->decode(at::zeros({16, 8, 8})); }).find("'z'"), std::string::npos);
  const std::string img = message([&] { vae->encode(at::zeros({1, 4, 16, 16})); });
  EXPECT_NE(img.find("'image'"), std::string::npos) << img;
  EXPECT_NE(img.find("[B, 3, H, W]"), std::string::npos) << img;
  EXPECT_NE(message([&] { vae->encode(at::zeros({3, 16, 16})); }).find("'image'"), std::string::npos);
}

// bf16 with force_upcast: the VAE runs in fp32 (as diffusers' pipelines
// upcast it), so it matches the fp32 load bit for bit. Without force_upcast
// it really computes in bf16 and stays close.
TEST_F(Vae, HalfPrecision) {
  auto z = checkpoint::read_tensor_file((decoder_dir() / "inputs.safetensors").string()).at("latents");
  const auto fp32 = load_vae(decoder_dir() / "model");
  const at::Tensor ref = fp32->decode(z);

  ModelOptions bf16;
  bf16.dtype = "bf16";
  const auto up = load_vae(decoder_dir() / "model", bf16);
  EXPECT_TRUE(up->upcast());
  EXPECT_EQ(up->compute_dtype(), "fp32");
  const at::Tensor a = up->decode(z.to(at::kBFloat16));
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_LE(max_abs(a, fp32->decode(z.to(at::kBFloat16))), 0.0);

  std::string cfg_path;
  auto cfg = read_component_config(decoder_dir() / "model", &cfg_path);
  cfg["force_upcast"] = false;
  auto source = checkpoint::open_weight_source((decoder_dir() / "model").string());
  const auto half = AutoencoderKL::load(*source, cfg, cfg_path, {}, bf16);
  EXPECT_FALSE(half->upcast());
  EXPECT_EQ(half->compute_dtype(), "bf16");
  const at::Tensor b = half->decode(z);
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  const double scale = at::abs(ref).max().item().toDouble();
  const double d = max_abs(b, ref);
  std::printf("  bf16 (no upcast) vs fp32: max abs diff %.3g (max |sample| %.3g)\n", d, scale);
  EXPECT_GT(d, 0.0);  // it did compute in bf16
  EXPECT_LE(d, 0.05 * scale);
}

using test::TempDir;

// A checkpoint whose every tensor has the table's shape except `bad`, which
// gets `bad_shape` (empty: left out).
void write_checkpoint(const fs::path& dir, const nlohmann::json& cfg, const std::string& bad,
                      const std::vector<int64_t>& bad_shape) {
  auto table = model_table_for(cfg, "config.json");
  ASSERT_TRUE(table);
  std::vector<std::vector<float>> buffers;
  std::vector<checkpoint::TensorPayload> payloads;
  buffers.reserve(table->tensors.size());
  for (const auto& spec : table->tensors) {
    checkpoint::TensorPayload p;
    p.name = spec.name;
    p.shape = spec.shape;
    if (spec.name == bad) {
      if (bad_shape.empty()) continue;
      p.shape = bad_shape;
    }
    int64_t n = 1;
    for (int64_t s : p.shape) n *= s;
    buffers.emplace_back(static_cast<size_t>(n), 0.5f);
    p.data = buffers.back().data();
    payloads.push_back(std::move(p));
  }
  checkpoint::write_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), std::move(payloads),
                                {{"format", "pt"}});
  checkpoint::write_file_atomically((dir / "config.json").string(), cfg.dump(2), true);
}

nlohmann::json small_config() {
  return {{"_class_name", "AutoencoderKL"},      {"block_out_channels", {8, 16}},
          {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D"}},
          {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D"}},
          {"in_channels", 3},                    {"out_channels", 3},
          {"latent_channels", 4},                {"layers_per_block", 1},
          {"norm_num_groups", 4},                {"use_quant_conv", true},
          {"use_post_quant_conv", true},         {"shift_factor", nullptr}};
}

TEST(VaeCheckpoint, WrongShapeRefusedBeforeReading) {
  TempDir dir;
  const auto cfg = small_config();
  write_checkpoint(dir.path(), cfg, "decoder.up_blocks.1.resnets.0.conv_shortcut.weight", {8, 16, 3, 3});
  auto source = checkpoint::open_weight_source(dir.path().string());
  try {
    AutoencoderKL::load(*source, cfg, "config.json");
    ADD_FAILURE() << "wrong shape accepted";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("decoder.up_blocks.1.resnets.0.conv_shortcut.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[8, 16, 1, 1]"), std::string::npos) << m;
    EXPECT_NE(m.find("[8, 16, 3, 3]"), std::string::npos) << m;
  }
  EXPECT_EQ(source->bytes_read(), 0u);
}

TEST(VaeCheckpoint, MissingTensorAndSmallModelRuns) {
  TempDir dir;
  const auto cfg = small_config();
  write_checkpoint(dir.path(), cfg, "post_quant_conv.bias", {});
  {
    auto source = checkpoint::open_weight_source(dir.path().string());
    try {
      AutoencoderKL::load(*source, cfg, "config.json");
      ADD_FAILURE() << "missing tensor accepted";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("post_quant_conv.bias"), std::string::npos) << e.what();
    }
    EXPECT_EQ(source->bytes_read(), 0u);
    // The encoder alone does not need it.
    ModelOptions enc_only;
    enc_only.part = "encoder";
    const auto enc = AutoencoderKL::load(*source, cfg, "config.json", {}, enc_only);
    // Odd sizes: Downsample2D pads (0,1,0,1) then a 3x3 stride-2 conv: 15 -> 7, 16 -> 8.
    const TensorMap dist = enc->encode(at::zeros({2, 3, 15, 16}));
    EXPECT_EQ(dist.at("mean").sizes(), (std::vector<int64_t>{2, 4, 7, 8}));
    EXPECT_EQ(dist.at("std").sizes(), (std::vector<int64_t>{2, 4, 7, 8}));
  }
  TempDir full;
  write_checkpoint(full.path(), cfg, "", {});
  auto source = checkpoint::open_weight_source(full.path().string());
  const auto vae = AutoencoderKL::load(*source, cfg, "config.json");
  Trace trace;
  const at::Tensor img = vae->decode(at::zeros({2, 4, 5, 6}), &trace);
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{2, 3, 10, 12}));
  ASSERT_FALSE(trace.empty());
  EXPECT_EQ(trace.front().first, "post_quant_conv");
  EXPECT_EQ(trace.back().first, "decoder.conv_out");
}

}  // namespace
}  // namespace tprun::models::vae_test
