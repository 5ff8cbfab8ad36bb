// WanTransformer3DModel's model layer without a checkpoint: the table's plan
// (the across-heads norm weights split with their heads, the fp32-kept
// tensors, the divisors tp is checked against), the config's defaults and
// refusals, the 3-D RoPE's split of a head and its table, and the
// across-heads RMSNorm against torch's own kernel at tp 1. (Parity with
// diffusers and the TP runs: tests/scripts/wan_transformer_parity.py.)
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/model_registry.h"
#include "models/wan_blocks.h"
#include "models/wan_rope.h"
#include "models/wan_transformer.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

using checkpoint::ShardStyle;

nlohmann::json tiny_wan() {
  return {{"_class_name", "WanTransformer3DModel"}, {"patch_size", {1, 2, 2}}, {"num_attention_heads", 4},
          {"attention_head_dim", 12}, {"in_channels", 6}, {"out_channels", 5}, {"text_dim", 20},
          {"freq_dim", 32}, {"ffn_dim", 64}, {"num_layers", 2}};
}

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WanTransformer, TableSplitsNormsWithTheirHeadsAndKeepsFp32Modules) {
  auto t = model_table_for(tiny_wan(), "config.json");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->cls, "WanTransformer3DModel");
  for (const char* attn : {"attn1", "attn2"}) {
    const std::string p = fmt::format("blocks.1.{}.", attn);
    EXPECT_EQ(t->find(p + "to_k.weight")->style, ShardStyle::Colwise);
    EXPECT_EQ(t->find(p + "to_out.0.weight")->style, ShardStyle::Rowwise);
    EXPECT_EQ(t->find(p + "to_out.0.bias")->style, ShardStyle::Replicated);
    const TensorSpec* norm = t->find(p + "norm_q.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->style, ShardStyle::Colwise);
    EXPECT_EQ(norm->shape, (std::vector<int64_t>{48}));
    EXPECT_EQ(norm->plan_key, fmt::format("blocks.*.{}.norm_q", attn));
    EXPECT_EQ(norm->kind, TensorKind::Norm);
  }
  // Rank 1 of 2 holds heads 2, 3: channels [24, 48) of the norm weight, as of to_q's output.
  const auto spans = checkpoint::split_spans("n", {48}, t->request("blocks.0.attn1.norm_k.weight", 1, 2));
  ASSERT_EQ(spans.spans.size(), 1u);
  EXPECT_EQ(spans.spans[0], (std::pair<int64_t, int64_t>{24, 24}));
  EXPECT_EQ(t->find("blocks.0.ffn.net.0.proj.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(t->find("blocks.0.ffn.net.2.weight")->style, ShardStyle::Rowwise);
  // diffusers' _keep_in_fp32_modules that hold parameters: fp32 whatever the compute dtype.
  for (const char* name : {"scale_shift_table", "blocks.0.scale_shift_table", "blocks.1.norm2.weight",
                           "blocks.1.norm2.bias", "condition_embedder.time_embedder.linear_1.weight",
                           "condition_embedder.time_embedder.linear_2.bias"}) {
    ASSERT_NE(t->find(name), nullptr) << name;
    EXPECT_EQ(t->find(name)->dtype, "fp32") << name;
    EXPECT_EQ(t->find(name)->style, ShardStyle::Replicated) << name;
  }
  EXPECT_EQ(t->find("condition_embedder.time_proj.weight")->dtype, "");
  EXPECT_EQ(t->find("patch_embedding.weight")->shape, (std::vector<int64_t>{48, 6, 1, 2, 2}));
  EXPECT_EQ(t->find("proj_out.weight")->shape, (std::vector<int64_t>{5 * 4, 48}));
  ASSERT_EQ(t->tp_divisors.size(), 2u);
  EXPECT_EQ(t->tp_divisors[0].field, "num_attention_heads");
  EXPECT_EQ(t->tp_divisors[1].field, "ffn_dim");
  EXPECT_THROW(validate_tp_size(*t, 3, "test"), ConfigError);  // 4 heads
  EXPECT_NO_THROW(validate_tp_size(*t, 4, "test"));

  ModelOptions o;
  o.shard_modulation = true;
  auto m = model_table_for(tiny_wan(), "config.json", o);
  EXPECT_EQ(m->find("condition_embedder.time_proj.weight")->style, ShardStyle::RowwiseSplitInput);
  // Without cross_attn_norm there is no norm2.
  nlohmann::json plain = tiny_wan();
  plain["cross_attn_norm"] = false;
  auto n = model_table_for(plain, "config.json");
  EXPECT_EQ(n->find("blocks.0.norm2.weight"), nullptr);
}

TEST(WanTransformer, ConfigDefaultsAreDiffusersAndVariantsAreRefusedByName) {
  const WanTransformerConfig d = WanTransformerConfig::from_json(nlohmann::json::object(), "config.json");
  EXPECT_EQ(d.patch_size, (std::array<int64_t, 3>{1, 2, 2}));
  EXPECT_EQ(d.heads, 40);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.in_channels, 16);
  EXPECT_EQ(d.out_channels, 16);
  EXPECT_EQ(d.text_dim, 4096);
  EXPECT_EQ(d.freq_dim, 256);
  EXPECT_EQ(d.ffn_dim, 13824);
  EXPECT_EQ(d.layers, 40);
  EXPECT_TRUE(d.cross_attn_norm);
  EXPECT_EQ(d.qk_norm, "rms_norm_across_heads");
  EXPECT_DOUBLE_EQ(d.eps, 1e-6);
  EXPECT_EQ(d.rope_max_seq_len, 1024);
  // `out_channels or in_channels`.
  EXPECT_EQ(WanTransformerConfig::from_json({{"in_channels", 36}, {"out_channels", nullptr}}, "c").out_channels, 36);
  EXPECT_EQ(WanTransformerConfig::from_json({{"in_channels", 36}, {"out_channels", 0}}, "c").out_channels, 36);
  EXPECT_EQ(WanTransformerConfig::from_json({{"qk_norm", nullptr}}, "c").qk_norm, "");
  // Null image fields are text to video; set, each is refused by name.
  EXPECT_NO_THROW(WanTransformerConfig::from_json({{"image_dim", nullptr}, {"added_kv_proj_dim", nullptr}}, "c"));
  for (const char* field : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"}) {
    const std::string e = error_of([&] { WanTransformerConfig::from_json({{field, 1280}}, "/m/config.json"); });
    EXPECT_NE(e.find(fmt::format("/m/config.json: field '{}' is 1280", field)), std::string::npos) << e;
    EXPECT_THROW(WanTransformerConfig::from_json({{field, 1280}}, "c"), ConfigError);
  }
  // Bounded, naming the file and field.
  const std::pair<nlohmann::json, const char*> bad[] = {
      {{{"attention_head_dim", 13}}, "'attention_head_dim' = 13 must be even"},
      {{{"patch_size", {2, 2}}}, "'patch_size' must have 3 entries"},
      {{{"patch_size", {1, 0, 2}}}, "patch_size"},
      {{{"patch_size", {1, 65, 2}}}, "patch_size"},
      {{{"rope_max_seq_len", int64_t{1} << 40}}, "rope_max_seq_len"},
      {{{"num_attention_heads", int64_t{1} << 62}}, "num_attention_heads"},
      {{{"eps", -1}}, "eps"},
      {{{"cross_attn_norm", "yes"}}, "cross_attn_norm"},
      {{{"qk_norm", 3}}, "qk_norm"},
  };
  for (const auto& [cfg, words] : bad) {
    const std::string e = error_of([&] { WanTransformerConfig::from_json(cfg, "/m/config.json"); });
    EXPECT_NE(e.find("/m/config.json"), std::string::npos) << cfg.dump() << ": " << e;
    EXPECT_NE(e.find(words), std::string::npos) << cfg.dump() << ": " << e;
  }
}

TEST(WanTransformer, RopeSplitsEachHeadIntoTimeHeightWidth) {
  EXPECT_EQ(wan_rope_dims(128), (std::array<int64_t, 3>{44, 42, 42}));
  EXPECT_EQ(wan_rope_dims(12), (std::array<int64_t, 3>{4, 4, 4}));
  EXPECT_EQ(wan_rope_dims(10), (std::array<int64_t, 3>{6, 2, 2}));
  // 2 frames of a 3 x 4 grid, head_dim 12: token (f, r, c) = f * 12 + r * 4 + c.
  const nn::Rope rope = wan_rope(2, 3, 4, 12, 1024, at::Device("cpu"));
  ASSERT_EQ(rope.cos->sizes(), (std::vector<int64_t>{24, 12}));
  const at::Tensor cos = rope.cos->to(at::kDouble), sin = rope.sin->to(at::kDouble);
  const int64_t token = 1 * 12 + 2 * 4 + 3;  // f 1, r 2, c 3
  // Each part's first pair turns by its position (frequency 1), its second by position / 100.
  const double expected[6] = {1.0, 0.01, 2.0, 0.02, 3.0, 0.03};
  for (int pair = 0; pair < 6; ++pair) {
    for (int k = 0; k < 2; ++k) {  // interleaved: channels 2j and 2j + 1 share the angle
      EXPECT_NEAR(cos[token][2 * pair + k].item<double>(), std::cos(expected[pair]), 1e-7) << pair;
      EXPECT_NEAR(sin[token][2 * pair + k].item<double>(), std::sin(expected[pair]), 1e-7) << pair;
    }
  }
  EXPECT_THROW(wan_rope(2, 3, 40, 12, 32, at::Device("cpu")), RequestError);
  EXPECT_NO_THROW(wan_rope(2, 3, 32, 12, 32, at::Device("cpu")));
}

TEST(WanTransformer, AcrossHeadsNormIsTorchsRmsNormAtTp1) {
  const at::Tensor x = at::randn({2, 5, 48}), y = at::randn({2, 3, 48}) * 3;
  const at::Tensor wx = 1 + 0.1 * at::randn({48}), wy = 1 + 0.1 * at::randn({48});
  auto [nx, ny] = rms_norm_across_heads(x, wx, y, wy, 48, 1e-6, parallel::TpContext{});
  EXPECT_TRUE(at::allclose(nx, at::rms_norm(x, {48}, wx, 1e-6), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(ny, at::rms_norm(y, {48}, wy, 1e-6), 1e-5, 1e-6));
  // bf16: the product with the weight in fp32, rounded once, as torch's kernel.
  const at::Tensor xb = x.to(at::kBFloat16), wb = wx.to(at::kBFloat16);
  auto [nb, unused] = rms_norm_across_heads(xb, wb, xb, wb, 48, 1e-6, parallel::TpContext{});
  EXPECT_EQ(nb.scalar_type(), at::kBFloat16);
  EXPECT_LE((nb.to(at::kFloat) - at::rms_norm(xb, {48}, wb, 1e-6).to(at::kFloat)).abs().max().item<float>(), 1e-2);
}

}  // namespace
}  // namespace tprun::models
