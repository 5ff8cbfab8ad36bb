// Adapter files mapped onto model tables (lora/lora_file_map.h): each format
// (diffusers / PEFT and its prefixes, kohya, the families' original names)
// gives the expected modules, B rows, ranks and scales; the kohya / BFL / Wan
// mappings agree with diffusers' own converters (tests/data/lora/
// names_expected.json, made by tests/scripts/lora_names_check.py); every
// refusal names the file and the key.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "lora/lora_file_map.h"
#include "models/lora_names.h"
#include "models/model_registry.h"
#include "models/model_table.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::lora {
namespace {

using checkpoint::Dtype;
using nlohmann::json;

// One tensor of a synthetic adapter: zeros, except an alpha's value.
struct T {
  std::string key;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::F32;
  std::optional<float> alpha;  // a one-element F32 tensor holding this value
};

T down(const std::string& stem, int64_t r, int64_t in) { return {stem + ".lora_A.weight", {r, in}}; }
T up(const std::string& stem, int64_t out, int64_t r) { return {stem + ".lora_B.weight", {out, r}}; }
T kdown(const std::string& stem, int64_t r, int64_t in) { return {stem + ".lora_down.weight", {r, in}}; }
T kup(const std::string& stem, int64_t out, int64_t r) { return {stem + ".lora_up.weight", {out, r}}; }
T alpha(const std::string& stem, float value) { return {stem + ".alpha", {}, Dtype::F32, value}; }

std::string write_adapter(const test::TempDir& dir, const std::string& name, const std::vector<T>& tensors,
                          const std::map<std::string, std::string>& metadata = {}) {
  static const std::vector<char> zeros(1 << 22, 0);
  std::vector<float> alphas;
  alphas.reserve(tensors.size());
  std::vector<checkpoint::TensorPayload> payloads;
  for (const T& t : tensors) {
    checkpoint::TensorPayload p{t.key, t.dtype, t.shape};
    if (t.alpha) {
      alphas.push_back(*t.alpha);
      p.data = &alphas.back();
    } else {
      p.data = zeros.data();
    }
    EXPECT_LE(p.nbytes(), zeros.size()) << t.key;
    payloads.push_back(std::move(p));
  }
  const std::string path = dir / name;
  checkpoint::write_safetensors(path, std::move(payloads), metadata, /*overwrite=*/true);
  return path;
}

json tiny_flux() {
  return {{"_class_name", "FluxTransformer2DModel"}, {"num_attention_heads", 4}, {"attention_head_dim", 16},
          {"num_layers", 2}, {"num_single_layers", 2}, {"in_channels", 16}, {"out_channels", nullptr},
          {"patch_size", 1}, {"joint_attention_dim", 32}, {"pooled_projection_dim", 24},
          {"guidance_embeds", true}, {"axes_dims_rope", {4, 6, 6}}};
}
constexpr int64_t kInner = 64;  // tiny_flux's 4 x 16

json tiny_clip() {
  return {{"architectures", {"CLIPTextModel"}}, {"vocab_size", 100}, {"hidden_size", 32},
          {"intermediate_size", 48}, {"num_attention_heads", 4}, {"num_hidden_layers", 2},
          {"max_position_embeddings", 16}};
}

json tiny_qwen() {
  return {{"_class_name", "QwenImageTransformer2DModel"}, {"num_attention_heads", 2}, {"attention_head_dim", 16},
          {"num_layers", 2}, {"in_channels", 16}, {"out_channels", 4}, {"patch_size", 2},
          {"joint_attention_dim", 24}, {"axes_dims_rope", {4, 6, 6}}};
}

// A model's table and config, as the pipeline hands them over.
struct Component {
  json config;
  models::ModelTable table;
  explicit Component(json c) : config(std::move(c)) {
    auto t = models::model_table_for(config, "config.json");
    EXPECT_TRUE(t.has_value());
    if (t) table = std::move(*t);
  }
  LoraComponentTarget target(const std::string& name, std::vector<std::string> dropped = {}) const {
    return {name, &table, &config, std::move(dropped)};
  }
};

LoraLayout map(const std::string& path, const std::vector<LoraComponentTarget>& targets, bool strict = true) {
  const auto file = checkpoint::ComponentCheckpoint::open(path);
  return map_lora_file(file, targets, strict);
}

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_TRUE(e.all_ranks()) << e.what();
    return e.what();
  }
  return "(no error)";
}

const LoraModulePart* part(const LoraLayout& l, const std::string& component, const std::string& module) {
  for (const auto& c : l.components) {
    if (c.component != component) continue;
    for (const auto& p : c.parts) {
      if (p.module == module) return &p;
    }
  }
  return nullptr;
}

size_t part_count(const LoraLayout& l) {
  size_t n = 0;
  for (const auto& c : l.components) n += c.parts.size();
  return n;
}

// ---- diffusers' converters, replayed ------------------------------------------

TEST(LoraNames, MatchDiffusersConverters) {
  std::ifstream in(test::data_dir("lora") / "names_expected.json");
  ASSERT_TRUE(in) << "tests/data/lora/names_expected.json (tests/scripts/lora_names_check.py writes it)";
  const json data = json::parse(in);
  ASSERT_GE(data["cases"].size(), 8u);
  test::TempDir dir;
  for (const json& c : data["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<T> tensors;
    for (const json& t : c["tensors"]) {
      T one{t["key"].get<std::string>(), t["shape"].get<std::vector<int64_t>>()};
      if (t.contains("alpha")) one.alpha = t["alpha"].get<float>();
      tensors.push_back(one);
    }
    const Component model{json(c["config"])};
    std::map<std::string, std::string> metadata;
    if (c.contains("metadata")) metadata["lora_adapter_metadata"] = c["metadata"].get<std::string>();
    const LoraLayout l = map(write_adapter(dir, c["name"].get<std::string>() + ".safetensors", tensors, metadata),
                             {model.target("transformer")});
    ASSERT_EQ(part_count(l), c["expected"].size());
    for (const json& e : c["expected"]) {
      const LoraModulePart* p = part(l, "transformer", e["module"].get<std::string>());
      ASSERT_NE(p, nullptr) << e["module"];
      EXPECT_EQ(p->down_key, e["down_key"]) << e["module"];
      EXPECT_EQ(p->up_key, e["up_key"]) << e["module"];
      EXPECT_EQ(p->up_row_offset, e["up_row_offset"]) << e["module"];
      EXPECT_EQ(p->up_rows, e["up_rows"]) << e["module"];
      EXPECT_EQ(p->up_halves_swapped, e["up_halves_swapped"]) << e["module"];
      EXPECT_EQ(p->rank, e["rank"]) << e["module"];
      EXPECT_NEAR(p->alpha_scale, e["alpha_scale"].get<double>(), 1e-9) << e["module"];
    }
  }
}

TEST(LoraNames, FamiliesRegisterTheirMaps) {
  for (const char* cls : {"FluxTransformer2DModel", "Flux2Transformer2DModel", "QwenImageTransformer2DModel",
                          "WanTransformer3DModel", "CLIPTextModel"}) {
    EXPECT_TRUE(models::has_lora_names(cls)) << cls;
  }
  EXPECT_EQ(models::expand_block_pattern("double_blocks.{i}.img_attn.qkv", 17), "double_blocks.17.img_attn.qkv");
  // A config the model refuses is refused here too, naming the file.
  json bad = tiny_flux();
  bad["num_layers"] = -1;
  try {
    models::lora_names_for("FluxTransformer2DModel", bad, "t/config.json");
    ADD_FAILURE() << "num_layers -1 accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("t/config.json"), std::string::npos) << e.what();
  }
}

// ---- formats --------------------------------------------------------------------

TEST(LoraFileMap, DiffusersPeftAndPrefixes) {
  test::TempDir dir;
  const Component flux(tiny_flux()), clip(tiny_clip());
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  const std::string te = "text_encoder.text_model.encoder.layers.1.self_attn.k_proj";
  const std::string path = write_adapter(
      dir, "a.safetensors",
      {down(q, 4, kInner), up(q, kInner, 4), alpha(q, 2.0f),
       // ai-toolkit / ComfyUI: a prefix and the original (BFL) names.
       down("diffusion_model.double_blocks.1.img_attn.qkv", 2, kInner),
       up("diffusion_model.double_blocks.1.img_attn.qkv", 3 * kInner, 2),
       down("base_model.model.single_transformer_blocks.1.proj_mlp", 3, kInner),
       up("base_model.model.single_transformer_blocks.1.proj_mlp", 4 * kInner, 3),
       // no prefix: the transformer's
       down("proj_out", 2, kInner), up("proj_out", 16, 2),
       down(te, 2, 32), up(te, 32, 2)});
  const LoraLayout l = map(path, {flux.target("transformer"), clip.target("text_encoder")});
  EXPECT_EQ(l.path, path);
  EXPECT_TRUE(l.skipped_keys.empty());
  ASSERT_EQ(l.components.size(), 2u);
  EXPECT_EQ(l.components[0].component, "transformer");
  const LoraModulePart* p = part(l, "transformer", "transformer_blocks.0.attn.to_q");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->down_key, q + ".lora_A.weight");
  EXPECT_EQ(p->rank, 4);
  EXPECT_DOUBLE_EQ(p->alpha_scale, 0.5);
  for (int k = 0; k < 3; ++k) {
    const char* m[] = {"to_q", "to_k", "to_v"};
    p = part(l, "transformer", fmt::format("transformer_blocks.1.attn.{}", m[k]));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->up_key, "diffusion_model.double_blocks.1.img_attn.qkv.lora_B.weight");
    EXPECT_EQ(p->up_row_offset, k * kInner);
    EXPECT_EQ(p->up_rows, kInner);
    EXPECT_DOUBLE_EQ(p->alpha_scale, 1.0);  // no alpha: alpha = r
  }
  ASSERT_NE(part(l, "transformer", "single_transformer_blocks.1.proj_mlp"), nullptr);
  EXPECT_EQ(part(l, "transformer", "proj_out")->up_rows, 16);
  p = part(l, "text_encoder", "text_model.encoder.layers.1.self_attn.k_proj");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->rank, 2);
  EXPECT_EQ(part_count(l), 7u);
  EXPECT_EQ(l.file_bytes, std::filesystem::file_size(path));
}

TEST(LoraFileMap, KohyaWithTheConfigsWidths) {
  test::TempDir dir;
  const Component flux(tiny_flux()), clip(tiny_clip());
  const std::string path = write_adapter(
      dir, "k.safetensors",
      {kdown("lora_unet_single_blocks_1_linear1", 4, kInner), kup("lora_unet_single_blocks_1_linear1", 7 * kInner, 4),
       alpha("lora_unet_single_blocks_1_linear1", 8.0f),
       kdown("lora_unet_final_layer_adaLN_modulation_1", 2, kInner),
       kup("lora_unet_final_layer_adaLN_modulation_1", 2 * kInner, 2),
       // underscored diffusers names
       kdown("lora_transformer_transformer_blocks_1_ff_context_net_2", 2, 4 * kInner),
       kup("lora_transformer_transformer_blocks_1_ff_context_net_2", kInner, 2),
       kdown("lora_te1_text_model_encoder_layers_0_mlp_fc1", 2, 32),
       kup("lora_te1_text_model_encoder_layers_0_mlp_fc1", 48, 2),
       alpha("lora_te1_text_model_encoder_layers_0_mlp_fc1", 1.0f),
       // FLUX.1 drops its T5's keys, as diffusers does
       kdown("lora_te2_encoder_block_0_layer_0_SelfAttention_q", 2, 8),
       kup("lora_te2_encoder_block_0_layer_0_SelfAttention_q", 8, 2)});
  const std::vector<std::string> t5 = {"lora_te2_", "text_encoders.t5xxl.", "text_encoder_2."};
  const LoraLayout l = map(path, {flux.target("transformer", t5), clip.target("text_encoder", t5)});
  const char* modules[] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
  const int64_t offsets[] = {0, kInner, 2 * kInner, 3 * kInner}, rows[] = {kInner, kInner, kInner, 4 * kInner};
  for (int k = 0; k < 4; ++k) {
    const LoraModulePart* p = part(l, "transformer", std::string("single_transformer_blocks.1.") + modules[k]);
    ASSERT_NE(p, nullptr) << modules[k];
    EXPECT_EQ(p->down_key, "lora_unet_single_blocks_1_linear1.lora_down.weight");
    EXPECT_EQ(p->up_row_offset, offsets[k]);
    EXPECT_EQ(p->up_rows, rows[k]);
    EXPECT_DOUBLE_EQ(p->alpha_scale, 2.0);
  }
  const LoraModulePart* n = part(l, "transformer", "norm_out.linear");
  ASSERT_NE(n, nullptr);
  EXPECT_TRUE(n->up_halves_swapped);
  EXPECT_EQ(n->up_rows, 2 * kInner);
  ASSERT_NE(part(l, "transformer", "transformer_blocks.1.ff_context.net.2"), nullptr);
  const LoraModulePart* fc1 = part(l, "text_encoder", "text_model.encoder.layers.0.mlp.fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_DOUBLE_EQ(fc1->alpha_scale, 0.5);
  EXPECT_EQ(l.skipped_keys.size(), 2u);
  // Without a text-encoder component the CLIP keys map to nothing: refused by name.
  const std::string e = error_of([&] { map(path, {flux.target("transformer", t5)}); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("lora_te1_text_model_encoder_layers_0_mlp_fc1"), std::string::npos) << e;
}

TEST(LoraFileMap, ClipWithoutTheTextModelPrefix) {
  // The table of a CLIP checkpoint transformers 5 saved: no "text_model." prefix.
  Component clip(tiny_clip());
  for (auto& t : clip.table.tensors) {
    if (t.name.rfind("text_model.", 0) == 0) t.name = t.name.substr(std::string("text_model.").size());
  }
  test::TempDir dir;
  const std::string te = "text_encoder.text_model.encoder.layers.1.self_attn.out_proj";
  const std::string k = "lora_te1_text_model_encoder_layers_0_mlp_fc2";
  const LoraLayout l = map(write_adapter(dir, "te.safetensors", {down(te, 2, 32), up(te, 32, 2), kdown(k, 2, 48),
                                                                 kup(k, 32, 2)}),
                           {clip.target("text_encoder")});
  ASSERT_NE(part(l, "text_encoder", "encoder.layers.1.self_attn.out_proj"), nullptr);
  ASSERT_NE(part(l, "text_encoder", "encoder.layers.0.mlp.fc2"), nullptr);
  EXPECT_EQ(part_count(l), 2u);
}

TEST(LoraFileMap, AdapterMetadata) {
  test::TempDir dir;
  const Component flux(tiny_flux());
  const std::string q = "transformer.transformer_blocks.0.attn.to_q", k = "transformer.transformer_blocks.0.attn.to_k";
  const std::string sk = "transformer.single_transformer_blocks.0.attn.to_k";
  const std::vector<T> tensors = {down(q, 4, kInner), up(q, kInner, 4), down(k, 2, kInner), up(k, kInner, 2),
                                  down(sk, 4, kInner), up(sk, kInner, 4)};
  const json meta = {{"transformer.r", 4}, {"transformer.lora_alpha", 8},
                     {"transformer.rank_pattern", {{"^transformer_blocks.0.attn.to_k", 2}}},
                     {"transformer.alpha_pattern", {{"attn.to_k", 6}}},
                     {"transformer.use_rslora", false}, {"transformer.target_modules", {"to_q", "to_k"}}};
  LoraLayout l = map(write_adapter(dir, "m.safetensors", tensors, {{"lora_adapter_metadata", meta.dump()}}),
                     {flux.target("transformer")});
  EXPECT_DOUBLE_EQ(part(l, "transformer", "transformer_blocks.0.attn.to_q")->alpha_scale, 2.0);
  EXPECT_DOUBLE_EQ(part(l, "transformer", "transformer_blocks.0.attn.to_k")->alpha_scale, 3.0);
  // PEFT matches a pattern at a '.' boundary: "attn.to_k" reaches the single
  // block's to_k too, the rank pattern anchored by '^' does not (rank 4 there).
  EXPECT_DOUBLE_EQ(part(l, "transformer", "single_transformer_blocks.0.attn.to_k")->alpha_scale, 1.5);

  json rs = {{"transformer.r", 4}, {"transformer.lora_alpha", 8}, {"transformer.use_rslora", true},
             {"transformer.rank_pattern", {{"^transformer_blocks.0.attn.to_k", 2}}}};
  l = map(write_adapter(dir, "rs.safetensors", tensors, {{"lora_adapter_metadata", rs.dump()}}),
          {flux.target("transformer")});
  EXPECT_DOUBLE_EQ(part(l, "transformer", "transformer_blocks.0.attn.to_q")->alpha_scale, 4.0);
  EXPECT_DOUBLE_EQ(part(l, "transformer", "transformer_blocks.0.attn.to_k")->alpha_scale, 8.0 / std::sqrt(2.0));

  auto refused = [&](const std::string& name, const std::string& metadata, const std::string& needle,
                     std::vector<T> extra = {}) {
    std::vector<T> all = tensors;
    all.insert(all.end(), extra.begin(), extra.end());
    const std::string path = write_adapter(dir, name, all, {{"lora_adapter_metadata", metadata}});
    const std::string e = error_of([&] { map(path, {flux.target("transformer")}); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  };
  refused("r.safetensors", json{{"transformer.r", 8}}.dump(),
          "has rank 4 but the header's 'lora_adapter_metadata' gives");
  refused("j.safetensors", "{not json", "not valid JSON");
  refused("t.safetensors", json{{"transformer.lora_alpha", "8"}}.dump(), "transformer.lora_alpha");
  refused("n.safetensors", json{{"transformer.lora_alpha", -1}}.dump(), "finite positive");
  refused("p.safetensors", json{{"transformer.rank_pattern", {{"to_(q", 2}}}}.dump(), "regular expression");
  refused("a.safetensors", meta.dump(), "alpha tensor", {alpha(q, 4.0f)});
}

TEST(LoraFileMap, QwenImageDropsPeftAlphasButNotKohyas) {
  test::TempDir dir;
  const Component qwen(tiny_qwen());
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  const std::string k = "lora_unet_transformer_blocks_1_img_mod_1";
  const LoraLayout l = map(write_adapter(dir, "q.safetensors",
                                         {down(q, 4, 32), up(q, 32, 4), alpha(q, 2.0f), kdown(k, 2, 32),
                                          kup(k, 192, 2), alpha(k, 8.0f)}),
                           {qwen.target("transformer")});
  EXPECT_DOUBLE_EQ(part(l, "transformer", "transformer_blocks.0.attn.to_q")->alpha_scale, 1.0);
  EXPECT_DOUBLE_EQ(part(l, "transformer", "transformer_blocks.1.img_mod.1")->alpha_scale, 4.0);
  EXPECT_EQ(l.skipped_keys, std::vector<std::string>{q + ".alpha"});
}

TEST(LoraFileMap, Flux2FinalLayerSwappedAsItsBaseWeights) {
  // diffusers' FLUX.2 LoRA converter maps final_layer.adaLN_modulation.1 to
  // norm_out.linear unswapped although its checkpoint converter swaps the base
  // weight's (shift, scale) halves; tprun swaps B's halves as for FLUX.1.
  test::TempDir dir;
  const Component flux2(json{{"_class_name", "Flux2Transformer2DModel"}, {"num_attention_heads", 2},
                             {"attention_head_dim", 8}, {"axes_dims_rope", {2, 2, 2, 2}}, {"num_layers", 1},
                             {"num_single_layers", 1}, {"in_channels", 8}, {"joint_attention_dim", 24},
                             {"timestep_guidance_channels", 32}, {"mlp_ratio", 2.0}, {"guidance_embeds", true}});
  const std::string f = "diffusion_model.final_layer.adaLN_modulation.1";
  const std::string m = "base_model.model.double_stream_modulation_txt.lin";
  const std::string path =
      write_adapter(dir, "f2.safetensors", {down(f, 2, 16), up(f, 32, 2), down(m, 2, 16), up(m, 96, 2)});
  const LoraLayout l = map(path, {flux2.target("transformer")});
  const LoraModulePart* p = part(l, "transformer", "norm_out.linear");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->up_halves_swapped);
  EXPECT_EQ(p->up_rows, 32);
  ASSERT_NE(part(l, "transformer", "double_stream_modulation_txt.linear"), nullptr);
}

// ---- refusals --------------------------------------------------------------------

TEST(LoraFileMap, KeysOfAnotherFamilyOrNoModule) {
  test::TempDir dir;
  const Component flux(tiny_flux());
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  const std::string wan = "diffusion_model.blocks.0.self_attn.q";
  const std::string path = write_adapter(dir, "wan.safetensors",
                                         {down(q, 2, kInner), up(q, kInner, 2), down(wan, 2, kInner),
                                          up(wan, kInner, 2), {"transformer.pos_embed.dora_scale", {1, kInner}},
                                          down("transformer.transformer_blocks.9.attn.to_q", 2, kInner),
                                          up("transformer.transformer_blocks.9.attn.to_q", kInner, 2)});
  const std::string e = error_of([&] { map(path, {flux.target("transformer")}); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("5 key(s) map to no module"), std::string::npos) << e;
  EXPECT_NE(e.find(wan + ".lora_A.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("FluxTransformer2DModel"), std::string::npos) << e;
  EXPECT_NE(e.find("double_blocks."), std::string::npos) << e;  // the family's own names, for comparison
  const LoraLayout l = map(path, {flux.target("transformer")}, /*strict=*/false);
  EXPECT_EQ(part_count(l), 1u);
  EXPECT_EQ(l.skipped_keys.size(), 5u);
  // Nothing of the file reaches the model: refused even when not strict.
  const std::string only_wan = write_adapter(dir, "only.safetensors", {down(wan, 2, kInner), up(wan, kInner, 2)});
  EXPECT_NE(error_of([&] { map(only_wan, {flux.target("transformer")}, false); }).find("no key adapts a module"),
            std::string::npos);
  const std::string none = write_adapter(dir, "none.safetensors", {{"weight", {2, 2}}});
  EXPECT_NE(error_of([&] { map(none, {flux.target("transformer")}, false); }).find(none), std::string::npos);
}

TEST(LoraFileMap, ShapesDtypesAlphasAndPairs) {
  test::TempDir dir;
  const Component flux(tiny_flux());
  const std::string q = "transformer.transformer_blocks.0.attn.to_q";
  const std::string qkv = "lora_unet_double_blocks_0_img_attn_qkv";
  int n = 0;
  auto refused = [&](const std::vector<T>& tensors, const std::vector<std::string>& needles) {
    const std::string path = write_adapter(dir, fmt::format("bad{}.safetensors", n++), tensors);
    const std::string e = error_of([&] { map(path, {flux.target("transformer")}); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    for (const auto& needle : needles) EXPECT_NE(e.find(needle), std::string::npos) << needle << " in: " << e;
  };
  refused({down(q, 2, kInner)}, {q + ".lora_A.weight", "has no up matrix"});
  refused({up(q, kInner, 2)}, {q + ".lora_B.weight", "has no down matrix"});
  refused({down(q, 2, kInner + 1), up(q, kInner, 2)}, {q + ".lora_A.weight", "[2, 65]", "[64, 64]"});
  refused({down(q, 2, kInner - 1), up(q, kInner, 2)}, {q + ".lora_A.weight", "[2, 63]"});
  refused({down(q, 2, kInner), up(q, kInner + 2, 2)}, {q + ".lora_B.weight", "[66, 2]", "64 output rows"});
  refused({down(q, 2, kInner), up(q, kInner, 3)}, {q + ".lora_B.weight", "[64, 3]", "[2, 64]"});
  refused({kdown(qkv, 2, kInner), kup(qkv, kInner, 2)}, {qkv + ".lora_up.weight", "192 output rows"});
  refused({down(q, 65, kInner), up(q, kInner, 65)}, {q + ".lora_A.weight", "a rank larger than the layer"});
  refused({down(q, 0, kInner), up(q, kInner, 0)}, {q + ".lora_A.weight", "rank 0"});
  refused({{q + ".lora_A.weight", {2, kInner}, Dtype::I32}, up(q, kInner, 2)}, {q + ".lora_A.weight", "I32"});
  refused({{q + ".lora_A.weight", {2, kInner, 1}}, up(q, kInner, 2)}, {q + ".lora_A.weight", "2-D"});
  refused({down(q, 2, kInner), up(q, kInner, 2), alpha(q, NAN)}, {q + ".alpha", "finite positive"});
  refused({down(q, 2, kInner), up(q, kInner, 2), alpha(q, -2.0f)}, {q + ".alpha", "finite positive"});
  refused({down(q, 2, kInner), up(q, kInner, 2), {q + ".alpha", {2}}}, {q + ".alpha", "one number"});
  refused({down(q, 2, kInner), up(q, kInner, 2), alpha(q, 1.0f), alpha("transformer.proj_out", 1.0f)},
          {"transformer.proj_out.alpha", "has no down and up"});
  // One module adapted twice: by two spellings of one name, or by a fused original and its part.
  refused({down(q, 2, kInner), up(q, kInner, 2), down("diffusion_model.transformer_blocks.0.attn.to_q", 2, kInner),
           up("diffusion_model.transformer_blocks.0.attn.to_q", kInner, 2)},
          {"adapted twice", "diffusion_model.transformer_blocks.0.attn.to_q.lora_A.weight"});
  refused({down(q, 2, kInner), up(q, kInner, 2), kdown(qkv, 2, kInner), kup(qkv, 3 * kInner, 2)},
          {"adapted twice", "transformer_blocks.0.attn.to_q", qkv + ".lora_down.weight"});
}

TEST(LoraFileMap, HostileSizes) {
  test::TempDir dir;
  const Component flux(tiny_flux());
  std::vector<T> many;
  for (size_t i = 0; i <= kMaxLoraKeys; ++i) many.push_back({fmt::format("k{}", i), {1}});
  const std::string path = write_adapter(dir, "many.safetensors", many);
  const std::string e = error_of([&] { map(path, {flux.target("transformer")}); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("more than an adapter may hold"), std::string::npos) << e;
  // A folder is not an adapter.
  std::filesystem::create_directories(dir.path() / "folder");
  std::ofstream(dir.path() / "folder" / "config.json") << json{{"_class_name", "X"}}.dump();
  write_adapter(dir, "folder/diffusion_pytorch_model.safetensors", {down("a", 1, 1), up("a", 1, 1)});
  EXPECT_NE(error_of([&] { map(dir / "folder", {flux.target("transformer")}); }).find("not a folder"),
            std::string::npos);
}

}  // namespace
}  // namespace tprun::lora
