// The model layer: a construction declares each tensor once; the table is the
// record of those declarations (styles, biases, plan keys, the derived TP
// plan), a load must ask for exactly what was recorded, unknown names are
// errors, and hostile config sizes are refused before anything is allocated.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/equal.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/slice_plan.h"
#include "checkpoint/tensor_file.h"
#include "models/model_builder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "presets/flux2_presets.h"
#include "presets/flux_presets.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

namespace fs = std::filesystem;
using checkpoint::ShardStyle;

nlohmann::json tiny_flux() {
  return {{"_class_name", "FluxTransformer2DModel"}, {"num_attention_heads", 4}, {"attention_head_dim", 16},
          {"num_layers", 2}, {"num_single_layers", 12}, {"in_channels", 16}, {"out_channels", nullptr},
          {"patch_size", 1}, {"joint_attention_dim", 32}, {"pooled_projection_dim", 24},
          {"guidance_embeds", true}, {"axes_dims_rope", {4, 6, 6}}};
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

TEST(ModelTable, FluxStylesBiasesAndPlanKeys) {
  auto t = model_table_for(tiny_flux(), "config.json");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_q.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_q.bias")->style, ShardStyle::Colwise);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_out.0.weight")->style, ShardStyle::Rowwise);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_out.0.bias")->style, ShardStyle::Replicated);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_out.0.bias")->plan_key, "transformer_blocks.*.attn.to_out.0");
  // "*" stands for 11 as well as 1: whole indices, not prefixes.
  EXPECT_EQ(t->find("single_transformer_blocks.11.proj_out.weight")->style, ShardStyle::PackedRowwise);
  EXPECT_EQ(t->find("single_transformer_blocks.11.proj_out.weight")->blocks, (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(t->find("transformer_blocks.0.norm1.linear.weight")->style, ShardStyle::Replicated);
  EXPECT_EQ(t->find("norm_out.linear.weight")->plan_key, "");
  EXPECT_EQ(t->find("transformer_blocks.0.attn.norm_q.weight")->kind, TensorKind::Norm);
  EXPECT_EQ(t->find("x_embedder.bias")->kind, TensorKind::Bias);
  ASSERT_EQ(t->tp_divisors.size(), 1u);
  EXPECT_EQ(t->tp_divisors[0].field, "num_attention_heads");

  ModelOptions o;
  o.shard_modulation = true;
  auto m = model_table_for(tiny_flux(), "config.json", o);
  EXPECT_EQ(m->find("transformer_blocks.0.norm1.linear.weight")->style, ShardStyle::RowwiseSplitInput);
  EXPECT_EQ(m->find("transformer_blocks.0.norm1.linear.bias")->style, ShardStyle::Replicated);
  EXPECT_EQ(m->find("single_transformer_blocks.3.norm.linear.weight")->style, ShardStyle::RowwiseSplitInput);
}

TEST(ModelTable, DerivedPlanIsDiffusersForm) {
  auto t = model_table_for(tiny_flux(), "config.json");
  const TpPlan plan = t->tp_plan();
  ASSERT_EQ(plan.size(), 17u);
  EXPECT_EQ(plan.front().pattern, "transformer_blocks.*.attn.to_q");
  EXPECT_EQ(plan.back().pattern, "single_transformer_blocks.*.proj_out");
  EXPECT_EQ(plan.back().style, ShardStyle::PackedRowwise);
  EXPECT_EQ(plan.back().blocks, (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(plan_key_of("single_transformer_blocks.11.attn.to_out.0"), "single_transformer_blocks.*.attn.to_out.0");
  EXPECT_EQ(plan_key_of("encoder.block.3.layer.1.DenseReluDense.wo"), "encoder.block.*.layer.1.DenseReluDense.wo");
  EXPECT_EQ(plan_key_of("double_stream_modulation_img.linear"), "double_stream_modulation_img.linear");
}

TEST(ModelTable, UnknownNamesAreNeverSilentlyReplicated) {
  auto t = model_table_for(tiny_flux(), "config.json");
  const std::string e = error_of([&] { t->request("transformer_blocks.9.attn.to_q.weight", 0, 2); });
  EXPECT_NE(e.find("'transformer_blocks.9.attn.to_q.weight' is not part of FluxTransformer2DModel"), std::string::npos)
      << e;
}

TEST(ModelTable, OneKeyWithTwoStylesIsAnInternalError) {
  const ModelTable t = record_table("Toy", [](ModelBuilder& b) {
    b.linear("blocks.0.fc", 8, 4, LinearDecl::colwise());
    b.linear("blocks.1.fc", 8, 4, LinearDecl::rowwise());
  });
  EXPECT_NE(error_of([&] { t.tp_plan(); }).find("plan key 'blocks.*.fc'"), std::string::npos);
}

TEST(ModelTable, HostileConfigSizesAreRefusedBeforeAllocation) {
  auto c = tiny_flux();
  c["num_single_layers"] = 2000000000;
  EXPECT_NE(error_of([&] { model_table_for(c, "config.json"); }).find("num_single_layers"), std::string::npos);
  c = tiny_flux();
  c["num_attention_heads"] = int64_t{1} << 62;
  EXPECT_NE(error_of([&] { model_table_for(c, "config.json"); }).find("num_attention_heads"), std::string::npos);
  const std::string e = error_of([] {
    record_table("Toy", [](ModelBuilder& b) { b.linear("huge", int64_t{1} << 31, int64_t{1} << 31); });
  });
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
}

TEST(TensorCensus, CountsDistinctBlockIndicesUnderAPrefix) {
  const TensorCensus census({"b.0.x", "b.0.y", "b.1.x", "b.10.x", "b.2", "b.x", "bb.3.x", "b.1a.x", "a.b.5.x"},
                            "ckpt");
  EXPECT_EQ(census.blocks("b"), 4);  // 0, 1, 10, 2: not "x", "1a", bb.3 or a.b.5
  EXPECT_EQ(census.blocks("bb"), 1);
  EXPECT_EQ(census.blocks("c"), 0);
  EXPECT_EQ(census.blocks(std::vector<std::string>{"c", "bb", "b"}), 4);
}

// Every component config the presets write (FLUX.1 transformer, CLIP, T5,
// AutoencoderKL; FLUX.2 transformer, AutoencoderKLFlux2, Qwen3, Mistral3).
std::vector<std::pair<std::string, nlohmann::json>> preset_configs() {
  const auto f1 = presets::flux_pipeline_preset(presets::flux_preset("tiny"), 1000, 600);
  const auto klein = presets::flux2_pipeline_preset(presets::flux2_preset("flux2-klein", "tiny"), 1000);
  const auto dev = presets::flux2_pipeline_preset(presets::flux2_preset("flux2-dev", "tiny"), 1000);
  return {{"flux", f1.config("transformer")},      {"clip", f1.config("text_encoder")},
          {"t5", f1.config("text_encoder_2")},     {"vae", f1.config("vae")},
          {"flux2", klein.config("transformer")},  {"vae2", klein.config("vae")},
          {"qwen3", klein.config("text_encoder")}, {"mistral3", dev.config("text_encoder")}};
}

// The integer fields of a config, as JSON pointers (nested objects included).
void integer_fields(const nlohmann::json& j, const std::string& at, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string p = at + "/" + it.key();
    if (it->is_object()) integer_fields(*it, p, out);
    if (it->is_number_integer()) out.push_back(p);
  }
}

// Hostile sizes in every integer field of every family's config: each is
// refused with the field named, or builds a bounded table, within
// milliseconds. The table is checked against the tensor names a checkpoint of
// the unchanged config holds, as every load and `tprun inspect` does.
TEST(ModelTable, HostileSizesInEveryConfigFieldAreBoundedAndNamed) {
  size_t cases = 0, refused = 0;
  for (const auto& [family, base] : preset_configs()) {
    const auto table = model_table_for(base, "/ckpt/config.json");
    ASSERT_TRUE(table) << family;
    std::vector<std::string> names;
    for (const auto& t : table->tensors) names.push_back(t.name);
    const TensorCensus census(names, "/ckpt");
    ASSERT_NO_THROW(model_table_for(base, "/ckpt/config.json", {}, &census)) << family;
    std::vector<std::string> fields;
    integer_fields(base, "", fields);
    ASSERT_GE(fields.size(), 4u) << family;
    for (const auto& field : fields) {
      const std::string key = field.substr(field.rfind('/') + 1);
      for (int64_t value : {int64_t{1000}, int64_t{2000000000}, int64_t{1} << 62, -(int64_t{1} << 62)}) {
        nlohmann::json c = base;
        c[nlohmann::json::json_pointer(field)] = value;
        const auto start = std::chrono::steady_clock::now();
        ++cases;
        std::string error;
        size_t tensors = 0;
        try {
          if (auto t = model_table_for(c, "/ckpt/config.json", {}, &census)) tensors = t->tensors.size();
        } catch (const Error& e) {
          error = e.what();
          EXPECT_TRUE(e.kind() == Error::Kind::Checkpoint || e.kind() == Error::Kind::Config)
              << family << " " << field << "=" << value << ": " << error;
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        EXPECT_LT(ms, 500.0) << family << " " << field << "=" << value;
        if (!error.empty()) {
          ++refused;
          EXPECT_NE(error.find(key), std::string::npos) << family << " " << field << "=" << value << ": " << error;
        } else {
          EXPECT_LE(tensors, 50000u) << family << " " << field << "=" << value;
        }
      }
    }
  }
  EXPECT_GE(cases, 300u);  // 8 families, 81 integer fields in all, 4 values each
  EXPECT_GE(refused, cases / 2) << "of " << cases;
}

// Every field of a config (JSON pointers; nested objects included, their own pointer too).
void all_fields(const nlohmann::json& j, const std::string& at, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string p = at + "/" + it.key();
    out.push_back(p);
    if (it->is_object()) all_fields(*it, p, out);
  }
}

// Seeded random mutations of every family's config (any field to a value of
// any type or size, one to three at a time): each is a tprun::Error (config
// or checkpoint, never internal, never another exception) or a bounded table,
// within milliseconds. The torch-free part of this is fuzzed (fuzz_model_config).
TEST(ModelTable, RandomConfigMutationsFailCleanly) {
  std::mt19937_64 rng(20261203);
  const std::vector<nlohmann::json> values = {
      0, -1, 1, 2, 3, 7, 1000, 1025, 65537, int64_t{2000000000}, int64_t{1} << 31, int64_t{1} << 40, int64_t{1} << 62,
      -(int64_t{1} << 62), uint64_t{1} << 63, 1.5, -0.0, 1e300, "x", "", nullptr, true, false,
      nlohmann::json::array(), {1, 2}, {int64_t{1} << 40, 3}, nlohmann::json::object(), {{"a", 1}}};
  size_t cases = 0;
  for (const auto& [family, base] : preset_configs()) {
    const auto table = model_table_for(base, "/ckpt/config.json");
    std::vector<std::string> names;
    for (const auto& t : table->tensors) names.push_back(t.name);
    const TensorCensus census(names, "/ckpt");
    std::vector<std::string> fields;
    all_fields(base, "", fields);
    for (int round = 0; round < 300; ++round) {
      nlohmann::json c = base;
      std::string what;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        const std::string& field = fields[rng() % fields.size()];
        const nlohmann::json& value = values[rng() % values.size()];
        const nlohmann::json::json_pointer ptr(field);
        // An earlier change may have replaced the object above it.
        if (!c.contains(ptr.parent_pointer()) || !c.at(ptr.parent_pointer()).is_object()) continue;
        c[ptr] = value;
        what += " " + field + "=" + value.dump();
      }
      ++cases;
      const auto start = std::chrono::steady_clock::now();
      try {
        if (auto t = model_table_for(c, "/ckpt/config.json", {}, &census)) {
          EXPECT_LE(t->tensors.size(), 50000u) << family << what;
        }
      } catch (const Error& e) {
        EXPECT_NE(e.kind(), Error::Kind::Internal) << family << what << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("/ckpt/config.json"), std::string::npos)
            << family << what << ": " << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << family << what << ": not a tprun::Error: " << e.what();
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(ms, 500.0) << family << what;
    }
  }
  EXPECT_EQ(cases, 2400u);
}

TEST(ModelTable, BlockCountsAreCheckedAgainstTheCheckpointFirst) {
  for (const auto& [family, base] : preset_configs()) {
    const auto table = model_table_for(base, "/ckpt/config.json");
    std::vector<std::string> names;
    for (const auto& t : table->tensors) names.push_back(t.name);
    const TensorCensus census(names, "/ckpt");
    nlohmann::json c = base;
    std::string field;
    for (const char* f : {"num_single_layers", "num_layers", "num_hidden_layers", "layers_per_block"})
      if (field.empty() && c.contains(f)) field = f;
    if (field.empty() && c.contains("text_config")) field = "text_config";
    ASSERT_FALSE(field.empty()) << family;
    nlohmann::json& target = field == "text_config" ? c["text_config"]["num_hidden_layers"] : c[field];
    if (field == "text_config") field = "num_hidden_layers";
    const int64_t held = target.get<int64_t>();
    for (int64_t value : {int64_t{2000000000}, held + 1}) {
      target = value;
      const std::string e = error_of([&] { model_table_for(c, "/ckpt/config.json", {}, &census); });
      EXPECT_NE(e.find(fmt::format("field '{}' is {} but /ckpt holds {} such block", field, value, held)),
                std::string::npos)
          << family << ": " << e;
    }
  }
  // Without a census (init-model) the plausible cap still holds.
  auto c = tiny_flux();
  c["num_single_layers"] = 1025;
  EXPECT_NE(error_of([&] { model_table_for(c, "config.json"); }).find("'num_single_layers' = 1025 is out of range"),
            std::string::npos);
}

class BuilderLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tprun_builder_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    checkpoint::write_tensor_file_f32((dir_ / "model.safetensors").string(),
                                      {{"fc.weight", at::randn({8, 4})}, {"fc.bias", at::randn({8})},
                                       {"norm.weight", at::randn({4})}});
    std::ofstream(dir_ / "config.json") << R"({"_class_name": "Toy"})";
    ck_ = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(dir_.string()));
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::shared_ptr<const checkpoint::ComponentCheckpoint> ck_;
};

TEST_F(BuilderLoad, LoadsWhatWasRecordedAndChecksTheRest) {
  parallel::ParallelLinear fc;
  parallel::Weight norm;
  auto declare = [&](ModelBuilder& b) {
    fc = b.linear("fc", 8, 4, LinearDecl::replicated().with_bias());
    norm = b.tensor("norm.weight", {4}, TensorKind::Norm);
    b.unused("buffer", {3}, TensorKind::Buffer);
  };
  checkpoint::SafetensorsSource source(ck_);
  BuiltModel built = build_model("Toy", source, {}, {}, declare);
  EXPECT_TRUE(fc.defined());
  EXPECT_EQ(norm.get().size(0), 4);
  EXPECT_EQ(built.table.tensors.size(), 4u);
  EXPECT_EQ(built.bytes_read, (8 * 4 + 8 + 4) * 4u);

  // A construction that asks for something other than it recorded.
  int calls = 0;
  const std::string e = error_of([&] {
    build_model("Toy", source, {}, {}, [&](ModelBuilder& b) { b.linear("fc", 8, ++calls == 1 ? 4 : 5, LinearDecl::replicated().with_bias()); });
  });
  EXPECT_NE(e.find("'fc.weight' declared as [8, 5]"), std::string::npos) << e;
  // The checkpoint lacks a declared tensor: named before any byte is read.
  const std::string missing = error_of([&] {
    build_model("Toy", source, {}, {}, [&](ModelBuilder& b) { b.tensor("absent.weight", {2}, TensorKind::Norm); });
  });
  EXPECT_NE(missing.find("tensor 'absent.weight' is missing"), std::string::npos) << missing;
  // A load filter leaves the rest undefined and unvalidated.
  BuildOptions only_fc;
  only_fc.wanted = [](const std::string& n) { return n.rfind("fc.", 0) == 0; };
  build_model("Toy", source, {}, only_fc, [&](ModelBuilder& b) {
    declare(b);
    b.tensor("absent.weight", {2}, TensorKind::Norm);
  });
  EXPECT_TRUE(fc.defined());
  EXPECT_FALSE(norm.defined());
}

TEST_F(BuilderLoad, NarrowStorageCastsLayersAndUpCastsPerUse) {
  parallel::ParallelLinear fc;
  parallel::Weight norm;
  auto declare = [&](ModelBuilder& b) {
    fc = b.linear("fc", 8, 4, LinearDecl::replicated().with_bias());
    norm = b.tensor("norm.weight", {4}, TensorKind::Norm);
  };
  checkpoint::SafetensorsSource source(ck_);
  const BuiltModel plain = build_model("Toy", source, {}, {}, declare);
  const at::Tensor w32 = fc.weight().get(), b32 = fc.bias().get();
  EXPECT_EQ(plain.bytes_stored, (8 * 4 + 8 + 4) * 4u);

  ModelOptions o;
  o.memory.layerwise_storage = "float8_e4m3fn";
  const BuildOptions bo = build_options(o, {"^never$"});
  EXPECT_EQ(bo.layerwise_skip.size(), default_layerwise_casting_skip_patterns().size() + 1);
  const BuiltModel cast = build_model("Toy", source, {}, bo, declare);
  // Linear weight and its bias in fp8 (1 byte), the norm kept (diffusers skips "norm").
  EXPECT_EQ(cast.bytes_stored, (8 * 4 + 8) * 1u + 4 * 4u);
  EXPECT_EQ(cast.bytes_read, plain.bytes_read);
  EXPECT_EQ(fc.weight().stored_bytes(), 8 * 4u);
  EXPECT_EQ(norm.stored_bytes(), 4 * 4u);
  const at::Tensor a = fc.weight().get(), b = fc.weight().get();
  EXPECT_EQ(a.scalar_type(), c10::ScalarType::Float);
  EXPECT_NE(a.data_ptr(), b.data_ptr());  // a fresh up-cast per use
  EXPECT_TRUE(a.equal(w32.to(c10::ScalarType::Float8_e4m3fn).to(c10::ScalarType::Float)));
  EXPECT_TRUE(fc.bias().get().equal(b32.to(c10::ScalarType::Float8_e4m3fn).to(c10::ScalarType::Float)));

  // A user pattern replaces the defaults; a module matched is kept whole (weight and bias).
  o.memory.layerwise_storage = "float8_e5m2";
  o.memory.layerwise_skip = std::vector<std::string>{"^fc$"};
  EXPECT_EQ(build_model("Toy", source, {}, build_options(o), declare).bytes_stored, plain.bytes_stored);
  o.memory.layerwise_skip = std::vector<std::string>{};
  EXPECT_EQ(build_model("Toy", source, {}, build_options(o), declare).bytes_stored, (8 * 4 + 8) * 1u + 4 * 4u);
  // Bad settings are named (the parser refuses them first; this is the builder's own check).
  o.memory.layerwise_skip = std::vector<std::string>{"(unclosed"};
  EXPECT_NE(error_of([&] { build_model("Toy", source, {}, build_options(o), declare); })
                .find("memory.layerwise_casting.skip: '(unclosed' is not a regular expression"),
            std::string::npos);
  o.memory.layerwise_skip.reset();
  o.memory.layerwise_storage = "int4";
  EXPECT_NE(error_of([&] { build_model("Toy", source, {}, build_options(o), declare); })
                .find("memory.layerwise_casting.storage: 'int4'"),
            std::string::npos);
}

TEST(NarrowStorage, SkipsAsDiffusersWalksTheModuleTree) {
  const auto& d = default_layerwise_casting_skip_patterns();
  EXPECT_TRUE(layerwise_casting_skipped("proj_out", d));
  EXPECT_FALSE(layerwise_casting_skipped("single_transformer_blocks.0.proj_out", d));  // ^proj_out$
  EXPECT_TRUE(layerwise_casting_skipped("norm_out.linear", d));                         // "norm" anywhere
  EXPECT_TRUE(layerwise_casting_skipped("transformer_blocks.0.norm1.linear", d));
  EXPECT_FALSE(layerwise_casting_skipped("transformer_blocks.0.attn.to_q", d));
  EXPECT_TRUE(layerwise_casting_skipped("x_embedder.pos_embed.proj", d));
  // An enclosing module's name matches: the whole subtree is skipped (re.search on each prefix).
  EXPECT_TRUE(layerwise_casting_skipped("transformer_blocks.0.attn.to_q", {"^transformer_blocks$"}));
  EXPECT_TRUE(layerwise_casting_skipped("transformer_blocks.0.attn.to_q", {"blocks\\.0$"}));
  EXPECT_FALSE(layerwise_casting_skipped("transformer_blocks.10.attn.to_q", {"blocks\\.1$"}));
  EXPECT_TRUE(layerwise_casting_skipped("anything", {"^$"}));  // matches the root: nothing is cast
  EXPECT_FALSE(layerwise_casting_skipped("anything", {}));
}

TEST(ModelTable, PackedBlockThatDoesNotDivideIsNamed) {
  checkpoint::ShardRequest r{ShardStyle::PackedColwise, 0, 4, {4, 6}, true};
  try {
    checkpoint::plan_slice("fused.weight", {10, 8}, 16, r);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'fused.weight': dim 0 block 1 (size 6) is not divisible by tp 4"),
              std::string::npos)
        << e.what();
  }
  r.blocks = {4, 5};
  EXPECT_THROW(checkpoint::plan_slice("fused.weight", {10, 8}, 16, r), CheckpointError);  // sum 9 != 10
}

TEST(ModelRegistry, KnowsEveryFamilyByClassName) {
  const auto names = model_family_names();
  for (const char* cls : {"FluxTransformer2DModel", "CLIPTextModel", "T5EncoderModel", "AutoencoderKL"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), cls), names.end()) << cls;
  }
  EXPECT_EQ(find_model_family("NoSuchModel"), nullptr);
  EXPECT_FALSE(model_table_for({{"_class_name", "NoSuchModel"}}, "config.json"));
}

}  // namespace
}  // namespace tprun::models
