// `tprun init-model --arch wan | wan-a14b` (presets/wan_presets.h): the
// configs against the keys diffusers 0.40 / transformers 5.17 save_pretrained
// write for WanPipeline's components, the sizes fitting together, the
// refusals, and (WanPresetFolder) the whole folder with its weights, which
// needs the Wan model tables (WanTransformer3DModel, AutoencoderKLWan,
// UMT5EncoderModel) registered.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/safetensors_header.h"
#include "models/model_registry.h"
#include "presets/pipeline_preset.h"
#include "presets/preset_registry.h"
#include "presets/wan_presets.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::set<std::string> keys(const json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// The keys WanPipeline.save_pretrained writes (diffusers 0.40, transformers
// 5.17: a WanPipeline of these classes saved in the venv, 2026-12), sorted.
const std::set<std::string> kTransformerKeys = {
    "_class_name",  "_diffusers_version",  "added_kv_proj_dim", "attention_head_dim", "cross_attn_norm",
    "eps",          "ffn_dim",             "freq_dim",          "image_dim",          "in_channels",
    "num_attention_heads", "num_layers",   "out_channels",      "patch_size",         "pos_embed_seq_len",
    "qk_norm",      "rope_max_seq_len",    "text_dim"};
const std::set<std::string> kVaeKeys = {
    "_class_name", "_diffusers_version", "attn_scales", "base_dim",      "decoder_base_dim",
    "dim_mult",    "dropout",            "in_channels", "is_residual",   "latents_mean",
    "latents_std", "num_res_blocks",     "out_channels", "patch_size",   "scale_factor_spatial",
    "scale_factor_temporal", "temperal_downsample", "z_dim"};
const std::set<std::string> kSchedulerKeys = {
    "_class_name", "_diffusers_version", "beta_end", "beta_schedule", "beta_start", "disable_corrector",
    "dynamic_thresholding_ratio", "final_sigmas_type", "flow_shift", "lower_order_final", "num_train_timesteps",
    "predict_x0", "prediction_type", "rescale_betas_zero_snr", "sample_max_value", "shift_terminal", "sigma_max",
    "sigma_min", "solver_order", "solver_p", "solver_type", "steps_offset", "thresholding", "time_shift_type",
    "timestep_spacing", "trained_betas", "use_beta_sigmas", "use_dynamic_shifting", "use_exponential_sigmas",
    "use_flow_sigmas", "use_karras_sigmas"};
// UMT5Config as transformers 5.17 writes it, with google/umt5-xxl's own extra
// keys (output_past, scalable_attention, tokenizer_class).
const std::set<std::string> kUmt5Keys = {
    "architectures", "classifier_dropout", "d_ff", "d_kv", "d_model", "decoder_start_token_id", "dense_act_fn",
    "dropout_rate", "dtype", "eos_token_id", "feed_forward_proj", "initializer_factor", "is_decoder",
    "is_encoder_decoder", "is_gated_act", "layer_norm_epsilon", "model_type", "num_decoder_layers", "num_heads",
    "num_layers", "output_past", "pad_token_id", "relative_attention_max_distance",
    "relative_attention_num_buckets", "scalable_attention", "tie_word_embeddings", "tokenizer_class",
    "transformers_version", "use_cache", "vocab_size"};

TEST(WanPresets, ConfigsAsDiffusersSavesThem) {
  for (const auto& name : presets::wan_preset_names()) {
    SCOPED_TRACE(name);
    const auto c = presets::wan_pipeline_preset(presets::wan_preset("wan", name), 600);
    const json &t = c.config("transformer"), &v = c.config("vae"), &te = c.config("text_encoder");
    EXPECT_EQ(keys(t), kTransformerKeys);
    EXPECT_EQ(keys(v), kVaeKeys);
    EXPECT_EQ(keys(c.scheduler), kSchedulerKeys);
    EXPECT_EQ(keys(te), kUmt5Keys);
    EXPECT_EQ(t["_class_name"], "WanTransformer3DModel");
    EXPECT_EQ(t["patch_size"], json::array({1, 2, 2}));
    EXPECT_EQ(t["qk_norm"], "rms_norm_across_heads");
    EXPECT_EQ(t["cross_attn_norm"], true);
    EXPECT_EQ(t["eps"], 1e-6);
    EXPECT_EQ(t["freq_dim"], 256);
    EXPECT_EQ(t["rope_max_seq_len"], 1024);
    EXPECT_TRUE(t["image_dim"].is_null() && t["added_kv_proj_dim"].is_null() && t["pos_embed_seq_len"].is_null());
    EXPECT_EQ(t["in_channels"], 16);
    EXPECT_EQ(t["out_channels"], 16);
    EXPECT_EQ(t["text_dim"], te["d_model"]);
    EXPECT_EQ(v["_class_name"], "AutoencoderKLWan");
    EXPECT_EQ(v["z_dim"], 16);
    EXPECT_EQ(v["temperal_downsample"], json::array({false, true, true}));
    EXPECT_EQ(v["latents_mean"].size(), 16u);
    EXPECT_EQ(v["latents_std"].size(), 16u);
    EXPECT_EQ(v["latents_mean"][0], -0.7571);
    EXPECT_EQ(v["latents_std"][15], 1.916);
    EXPECT_EQ(v["scale_factor_spatial"], 8);
    EXPECT_EQ(v["scale_factor_temporal"], 4);
    EXPECT_EQ(te["architectures"], json::array({"UMT5EncoderModel"}));
    EXPECT_EQ(te["model_type"], "umt5");
    EXPECT_EQ(te["feed_forward_proj"], "gated-gelu");
    EXPECT_EQ(te["relative_attention_num_buckets"], 32);
    EXPECT_EQ(te["relative_attention_max_distance"], 128);
    EXPECT_EQ(te["vocab_size"], 640);  // 600 rounded up to a multiple of 128
    EXPECT_EQ(c.scheduler["_class_name"], "UniPCMultistepScheduler");
    EXPECT_EQ(c.scheduler["prediction_type"], "flow_prediction");
    EXPECT_EQ(c.scheduler["use_flow_sigmas"], true);
    EXPECT_EQ(c.scheduler["flow_shift"], 3.0);
    EXPECT_EQ(c.scheduler["solver_order"], 2);
    EXPECT_EQ(c.scheduler["solver_type"], "bh2");
    EXPECT_EQ(c.scheduler["lower_order_final"], true);
  }
}

TEST(WanPresets, ModelIndexOfBothLayouts) {
  const json wan21 = presets::wan_pipeline_preset(presets::wan_preset("wan", "tiny"), 600).model_index();
  EXPECT_EQ(wan21, json({{"_class_name", "WanPipeline"},
                         {"_diffusers_version", presets::kDiffusersVersion},
                         {"boundary_ratio", nullptr},
                         {"expand_timesteps", false},
                         {"scheduler", json::array({"diffusers", "UniPCMultistepScheduler"})},
                         {"text_encoder", json::array({"transformers", "UMT5EncoderModel"})},
                         {"tokenizer", json::array({"transformers", "T5TokenizerFast"})},
                         {"transformer", json::array({"diffusers", "WanTransformer3DModel"})},
                         {"transformer_2", json::array({nullptr, nullptr})},
                         {"vae", json::array({"diffusers", "AutoencoderKLWan"})}}));
  const auto a14b = presets::wan_pipeline_preset(presets::wan_preset("wan-a14b", "tiny"), 600);
  const json index = a14b.model_index();
  EXPECT_EQ(index["boundary_ratio"], 0.875);
  EXPECT_EQ(index["expand_timesteps"], false);
  EXPECT_EQ(index["transformer_2"], json::array({"diffusers", "WanTransformer3DModel"}));
  EXPECT_EQ(a14b.config("transformer_2"), a14b.config("transformer"));
  std::vector<std::string> order;
  for (const auto& comp : a14b.components) order.push_back(comp.name);
  EXPECT_EQ(order, (std::vector<std::string>{"transformer", "transformer_2", "vae", "text_encoder"}));
}

// tiny and small: heads that tp 1, 2 and 4 divide, a head_dim the 3-D RoPE
// splits into even parts, the same sizes for both architectures.
TEST(WanPresets, TinyAndSmallSizes) {
  for (const std::string arch : {"wan", "wan-a14b"}) {
    for (const auto& name : presets::wan_preset_names()) {
      SCOPED_TRACE(arch + " " + name);
      const auto p = presets::wan_preset(arch, name);
      EXPECT_EQ(p.name, name);
      EXPECT_EQ(p.two_experts, arch == "wan-a14b");
      EXPECT_EQ(p.num_attention_heads % 4, 0);
      EXPECT_EQ(p.text_heads % 4, 0);
      const int64_t part = p.attention_head_dim / 6, time = p.attention_head_dim - 4 * part;
      EXPECT_GT(part, 0);
      EXPECT_EQ(time % 2, 0);
      EXPECT_EQ(part * 6, p.attention_head_dim);  // equal thirds
    }
  }
  EXPECT_EQ(presets::wan_preset("wan", "tiny").num_layers, 2);
  EXPECT_EQ(presets::wan_preset("wan", "small").num_layers, 4);
  EXPECT_EQ(presets::wan_preset("wan-a14b", "small").attention_head_dim,
            presets::wan_preset("wan", "small").attention_head_dim);
}

TEST(WanPresets, MismatchesAreConfigErrors) {
  const auto c = presets::wan_pipeline_preset(presets::wan_preset("wan-a14b", "tiny"), 600);
  auto expect_error = [&](const presets::PipelinePreset& bad, const std::string& field) {
    try {
      presets::check_wan_pipeline_preset(bad, 600);
      ADD_FAILURE() << "no error for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  EXPECT_NO_THROW(presets::check_wan_pipeline_preset(c, 600));
  auto bad = c;
  bad.config("transformer")["text_dim"] = 48;
  expect_error(bad, "text_dim");
  bad = c;
  bad.config("transformer")["attention_head_dim"] = 5;
  expect_error(bad, "attention_head_dim");
  bad = c;
  bad.config("transformer")["num_attention_heads"] = 0;
  expect_error(bad, "num_attention_heads");
  bad = c;
  bad.config("transformer")["in_channels"] = 4;
  expect_error(bad, "z_dim");
  bad = c;
  bad.config("vae")["latents_std"] = json::array({1.0, 2.0});
  expect_error(bad, "latents_std");
  bad = c;
  bad.config("vae")["dim_mult"] = json::array({1, 2, 4});
  expect_error(bad, "dim_mult");
  bad = c;
  bad.config("text_encoder")["vocab_size"] = 512;
  expect_error(bad, "vocab_size");
  bad = c;
  bad.config("text_encoder")["d_model"] = "32";
  expect_error(bad, "'d_model'");
  bad = c;
  bad.config("transformer_2")["num_layers"] = 3;
  expect_error(bad, "transformer_2/config.json");
  bad = c;
  bad.index_extras["boundary_ratio"] = nullptr;
  expect_error(bad, "boundary_ratio");
}

// The architectures as registered: --arch wan and wan-a14b, the Wan family's
// own name in the --arch order, unknown presets and architectures refused.
TEST(WanPresets, RegisteredAndRefusals) {
  const auto* wan = presets::find_preset_arch("wan");
  const auto* a14b = presets::find_preset_arch("wan-a14b");
  ASSERT_NE(wan, nullptr);
  ASSERT_NE(a14b, nullptr);
  EXPECT_EQ(wan->family, "Wan");
  EXPECT_EQ(a14b->family, "Wan");
  EXPECT_EQ(wan->preset_names, (std::vector<std::string>{"tiny", "small"}));
  EXPECT_EQ(wan->resolve("wan", "tiny").what, "Wan 2.1 pipeline 'tiny'");
  EXPECT_EQ(a14b->resolve("wan-a14b", "small").what, "Wan 2.2 A14B pipeline 'small'");
  for (const auto* a : {wan, a14b}) {
    for (const std::string bad : {"huge", "", "Tiny", "tiny "}) {
      try {
        a->resolve(a->arch, bad);
        ADD_FAILURE() << a->arch << " '" << bad << "': no error";
      } catch (const ConfigError& e) {
        EXPECT_EQ(std::string(e.what()), "unknown preset '" + bad + "'; choose one of: tiny, small");
      }
    }
  }
  try {
    presets::wan_preset("wan2", "tiny");
    ADD_FAILURE() << "no error for --arch wan2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'wan2' is not a Wan architecture (wan, wan-a14b)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(presets::find_preset_arch("wan2.1"), nullptr);
}

// The whole folder, weights included, through the registered writer.
// Needs the model tables of WanTransformer3DModel, AutoencoderKLWan and
// UMT5EncoderModel (models/model_registry.h); without them the writer fails
// naming the class and leaves nothing behind.
TEST(WanPresetFolder, TinyFoldersAreComplete) {
  test::TempDir tmp;
  for (const std::string arch : {"wan", "wan-a14b"}) {
    SCOPED_TRACE(arch);
    const fs::path dir = tmp.path() / arch;
    const presets::WrittenPreset w = presets::find_preset_arch(arch)->resolve(arch, "tiny").write(dir.string(), 0, false);
    EXPECT_GT(w.summary.tensors, 0);
    EXPECT_EQ(w.details, "UMT5 tokenizer " + std::to_string(w.summary.text_vocab_size));
    const auto folder = checkpoint::open_pipeline_folder(dir.string());
    EXPECT_EQ(folder.cls, "WanPipeline");
    const json index = read_json(dir / "model_index.json");
    EXPECT_EQ(index["boundary_ratio"], arch == "wan" ? json(nullptr) : json(0.875));
    std::vector<std::pair<std::string, std::string>> components = {
        {"transformer", "diffusion_pytorch_model.safetensors"},
        {"vae", "diffusion_pytorch_model.safetensors"},
        {"text_encoder", "model.safetensors"}};
    if (arch == "wan-a14b") components.push_back({"transformer_2", "diffusion_pytorch_model.safetensors"});
    EXPECT_EQ(fs::exists(dir / "transformer_2"), arch == "wan-a14b");
    for (const auto& [name, file] : components) {
      SCOPED_TRACE(name);
      const fs::path config_path = dir / name / "config.json";
      const auto table = models::model_table_for(read_json(config_path), config_path.string());
      ASSERT_TRUE(table.has_value());
      const auto header = checkpoint::read_safetensors_header((dir / name / file).string());
      size_t required = 0;
      for (const auto& t : table->tensors) {
        if (t.optional) continue;
        ++required;
        const auto* e = header.find(t.name);
        ASSERT_NE(e, nullptr) << t.name;
        EXPECT_EQ(e->shape, t.shape) << t.name;
      }
      EXPECT_EQ(header.tensors.size(), required);
    }
    // UMT5: only the shared embedding is saved (as transformers saves the tied pair).
    const auto te = checkpoint::read_safetensors_header((dir / "text_encoder" / "model.safetensors").string());
    EXPECT_NE(te.find("shared.weight"), nullptr);
    EXPECT_EQ(te.find("encoder.embed_tokens.weight"), nullptr);
    EXPECT_TRUE(fs::is_regular_file(dir / "tokenizer" / "spiece.model"));
    EXPECT_TRUE(fs::is_regular_file(dir / "scheduler" / "scheduler_config.json"));
  }
  // The two experts are seeded apart (component_seed per folder name).
  std::ifstream a(tmp.path() / "wan-a14b" / "transformer" / "diffusion_pytorch_model.safetensors", std::ios::binary),
      b(tmp.path() / "wan-a14b" / "transformer_2" / "diffusion_pytorch_model.safetensors", std::ios::binary);
  std::stringstream sa, sb;
  sa << a.rdbuf();
  sb << b.rdbuf();
  EXPECT_NE(sa.str(), sb.str());
}

}  // namespace
}  // namespace tprun
