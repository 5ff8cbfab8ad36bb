// The TP plan as data: patterns select modules of the model table; bad keys
// and sizes that do not divide are errors that name what is wrong.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/slice_plan.h"
#include "models/model_table.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

using checkpoint::ShardStyle;

nlohmann::json tiny_flux() {
  return {{"_class_name", "FluxTransformer2DModel"}, {"num_attention_heads", 4}, {"attention_head_dim", 16},
          {"num_layers", 2}, {"num_single_layers", 12}, {"in_channels", 16}, {"out_channels", nullptr},
          {"patch_size", 1}, {"joint_attention_dim", 32}, {"pooled_projection_dim", 24},
          {"guidance_embeds", true}, {"axes_dims_rope", {4, 6, 6}}};
}

std::string error_of(ModelTable table, const TpPlan& plan) {
  try {
    apply_tp_plan(table, plan);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TpPlan, FluxPlanStylesAndBiases) {
  auto t = model_table_for(tiny_flux(), "config.json");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_q.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_q.bias")->style, ShardStyle::Colwise);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_out.0.weight")->style, ShardStyle::Rowwise);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_out.0.bias")->style, ShardStyle::Replicated);
  EXPECT_EQ(t->find("transformer_blocks.1.attn.to_out.0.bias")->plan_key, "transformer_blocks.*.attn.to_out.0");
  // "*" matches 11 as well as 1: whole indices, not prefixes.
  EXPECT_EQ(t->find("single_transformer_blocks.11.proj_out.weight")->style, ShardStyle::PackedRowwise);
  EXPECT_EQ(t->find("single_transformer_blocks.11.proj_out.weight")->blocks, (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(t->find("transformer_blocks.0.norm1.linear.weight")->style, ShardStyle::Replicated);
  EXPECT_EQ(t->find("norm_out.linear.weight")->plan_key, "");
  TableOptions o;
  o.shard_modulation = true;
  auto m = model_table_for(tiny_flux(), "config.json", o);
  EXPECT_EQ(m->find("transformer_blocks.0.norm1.linear.weight")->style, ShardStyle::RowwiseSplitInput);
  EXPECT_EQ(m->find("transformer_blocks.0.norm1.linear.bias")->style, ShardStyle::Replicated);
  EXPECT_EQ(m->find("single_transformer_blocks.3.norm.linear.weight")->style, ShardStyle::RowwiseSplitInput);
}

TEST(TpPlan, BadKeysAreNamed) {
  ModelTable base;
  base.cls = "Toy";
  base.tensors = {{"blocks.0.fc.weight", {8, 4}}, {"blocks.0.fc.bias", {8}}, {"blocks.1.fc.weight", {8, 4}},
                  {"blocks.1.fc.bias", {8}}, {"head.weight", {2, 8}}};
  std::string e = error_of(base, {{"blocks.*.fcc", ShardStyle::Colwise, {}}});
  EXPECT_NE(e.find("tp_plan key 'blocks.*.fcc' matches no module of Toy"), std::string::npos) << e;
  e = error_of(base, {{"blocks.*.*", ShardStyle::Colwise, {}}});
  EXPECT_NE(e.find("more than one '*'"), std::string::npos) << e;
  e = error_of(base, {{"blocks.*.fc", ShardStyle::Colwise, {}}, {"blocks.1.fc", ShardStyle::Rowwise, {}}});
  EXPECT_NE(e.find("matched by tp_plan keys 'blocks.*.fc' and 'blocks.1.fc'"), std::string::npos) << e;
  EXPECT_EQ(error_of(base, {{"head", ShardStyle::Rowwise, {}}}), "");  // a key without '*': the model itself
  ModelTable ok = base;
  apply_tp_plan(ok, {{"blocks.*.fc", ShardStyle::Colwise, {}}});
  EXPECT_EQ(ok.request("blocks.1.fc.bias", 1, 2).style, ShardStyle::Colwise);
  EXPECT_EQ(ok.request("head.weight", 1, 2).style, ShardStyle::Replicated);
}

TEST(TpPlan, PackedBlockThatDoesNotDivideIsNamed) {
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

}  // namespace
}  // namespace tprun::models
