// Slices of every TP style: the ranks' slices put back together give the full
// tensor; the loader reads exactly the slice's bytes; shard-on-load equals
// load-then-shard; the Flux table matches the diffusers reference checkpoint.
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <set>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_loader.h"
#include "checkpoint/slice_plan.h"
#include "checkpoint/torch_dtype.h"
#include "models/model_registry.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;

using test::source_dir;

using test::TempDir;

// Reassembles per-rank slices of a (packed) style along its split dim.
at::Tensor reassemble(const std::vector<at::Tensor>& parts, const ShardRequest& r,
                      const std::vector<int64_t>& block_sizes) {
  const bool col = r.style == ShardStyle::Colwise || r.style == ShardStyle::PackedColwise;
  const int64_t dim = col ? 0 : 1;
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t b : block_sizes) {
    const int64_t part = b / r.tp_size;
    for (const auto& p : parts) pieces.push_back(p.narrow(dim, offset, part));
    offset += part;
  }
  return at::cat(pieces, dim);
}

struct StyleCase {
  ShardStyle style;
  std::vector<int64_t> blocks;
  std::vector<int64_t> shape;
};

TEST(Slices, EveryStyleReassemblesAndReadsOnlyItsBytes) {
  TempDir dir;
  const std::vector<StyleCase> cases = {
      {ShardStyle::Colwise, {}, {24, 10}},
      {ShardStyle::Colwise, {}, {24}},  // a colwise bias
      {ShardStyle::Colwise, {}, {12, 4, 3, 3}},  // conv-like trailing dims
      {ShardStyle::Rowwise, {}, {10, 24}},
      {ShardStyle::Rowwise, {}, {6, 12, 3}},
      {ShardStyle::PackedColwise, {1, 1}, {48, 8}},
      {ShardStyle::PackedColwise, {1, 1, 1, 3, 3}, {108, 4}},
      {ShardStyle::PackedRowwise, {1, 1}, {5, 48}},
      {ShardStyle::PackedRowwise, {1, 1, 1, 3, 3}, {3, 108}},
  };
  std::vector<TensorPayload> payload;
  std::vector<at::Tensor> full;
  for (size_t i = 0; i < cases.size(); ++i) {
    full.push_back(at::randn(cases[i].shape).to(at::kBFloat16));
    TensorPayload p;
    p.name = fmt::format("t{}", i);
    p.dtype = Dtype::BF16;
    p.shape = cases[i].shape;
    p.data = full.back().data_ptr();
    payload.push_back(p);
  }
  const auto file = (dir.path() / "w.safetensors").string();
  write_safetensors(file, payload);
  auto ck = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(file));
  for (int tp : {1, 2, 3, 4}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      SCOPED_TRACE(testing::Message() << shard_style_name(c.style) << " case " << i << " tp " << tp);
      const bool col = c.style == ShardStyle::Colwise || c.style == ShardStyle::PackedColwise;
      const int64_t split = c.shape[col ? 0 : 1];
      ShardRequest r{c.style, 0, tp, c.blocks, false};
      std::vector<int64_t> blocks{split};
      if (!c.blocks.empty()) blocks = packed_block_sizes("t", split, r);
      bool divisible = true;
      for (auto b : blocks) divisible &= b % tp == 0;
      if (!divisible) {
        try {
          plan_slice(fmt::format("t{}", i), c.shape, 16, r);
          ADD_FAILURE() << "expected an error";
        } catch (const CheckpointError& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find(fmt::format("tensor 't{}'", i)), std::string::npos) << m;
          EXPECT_NE(m.find(fmt::format("dim {}", col ? 0 : 1)), std::string::npos) << m;
          EXPECT_NE(m.find(fmt::format("tp {}", tp)), std::string::npos) << m;
        }
        continue;
      }
      std::vector<at::Tensor> parts;
      for (int rank = 0; rank < tp; ++rank) {
        r.tp_rank = rank;
        SafetensorsSource src(ck);
        ShardLoader loader(src, {});
        at::Tensor part = loader.load(fmt::format("t{}", i), r);
        const SlicePlan plan = plan_slice("t", c.shape, 16, r);
        EXPECT_EQ(src.bytes_read(), plan.bytes) << "read exactly the slice";
        EXPECT_EQ(plan.bytes, static_cast<uint64_t>(full[i].numel()) * 2 / tp);
        // colwise: one range; packed colwise: one per block; rowwise: one per
        // row (per block); adjacent ranges merge.
        const size_t nblocks = std::max<size_t>(1, c.blocks.size());
        const size_t limit = col ? nblocks : static_cast<size_t>(c.shape[0]) * nblocks;
        EXPECT_LE(plan.ranges.size(), limit);
        if (tp == 1) EXPECT_EQ(plan.ranges.size(), 1u);
        // Load-then-shard gives the same slice.
        SafetensorsSource src2(ck);
        ShardLoader whole(src2, {LoadMode::LoadThenShard});
        EXPECT_TRUE(at::equal(part, whole.load(fmt::format("t{}", i), r)));
        EXPECT_EQ(src2.bytes_read(), static_cast<uint64_t>(full[i].numel()) * 2) << "load-then-shard reads all";
        parts.push_back(part);
      }
      EXPECT_TRUE(at::equal(reassemble(parts, r, blocks), full[i]));
    }
  }
}

TEST(Slices, ComputeDtypeConversionAndLoadMany) {
  TempDir dir;
  at::Tensor a = at::randn({8, 4});
  at::Tensor b = at::randn({4, 8});
  const auto file = (dir.path() / "w.safetensors").string();
  write_safetensors(file, {{"a", Dtype::F32, {8, 4}, a.data_ptr()}, {"b", Dtype::F32, {4, 8}, b.data_ptr()}});
  auto ck = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(file));
  SafetensorsSource src(ck);
  LoadOptions o;
  o.dtype = "bf16";
  ShardLoader loader(src, o);
  auto out = loader.load_many({{"b", {ShardStyle::Rowwise, 1, 2, {}, false}},
                               {"a", {ShardStyle::Colwise, 0, 2, {}, false}}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(out[0], b.narrow(1, 4, 4).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(out[1], a.narrow(0, 0, 4).to(at::kBFloat16)));
  EXPECT_EQ(loader.bytes_read(), 2u * 16 * 4);
  EXPECT_THROW(ShardLoader(src, {LoadMode::ShardOnLoad, "cpu", "int4"}), ConfigError);
}

TEST(Slices, UncomputableDtypeIsNamed) {
  TempDir dir;
  at::Tensor i = at::arange(6, at::kLong);
  const auto file = (dir.path() / "w.safetensors").string();
  write_safetensors(file, {{"ids", Dtype::I64, {6}, i.data_ptr()}});
  auto ck = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(file));
  SafetensorsSource src(ck);
  ShardLoader keep(src, {});
  EXPECT_TRUE(at::equal(keep.load("ids", {}), i));
  ShardLoader conv(src, {LoadMode::ShardOnLoad, "cpu", "fp32"});
  try {
    conv.load("ids", {});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'ids' is stored as I64"), std::string::npos) << e.what();
  }
}

TEST(FluxTable, MatchesTheDiffusersReferenceCheckpoint) {
  const fs::path dir = source_dir() / "tests/data/flux_transformer/model";
  ASSERT_TRUE(fs::exists(dir)) << "committed reference data missing: " << dir;
  auto ck = ComponentCheckpoint::open(dir.string());
  auto table = models::model_table_for(ck.config(), (dir / "config.json").string());
  ASSERT_TRUE(table);
  ASSERT_EQ(table->tp_divisors.size(), 1u);
  EXPECT_EQ(table->tp_divisors[0].value, 4);
  std::set<std::string> in_table;
  for (const auto& t : table->tensors) {
    in_table.insert(t.name);
    ASSERT_TRUE(ck.contains(t.name)) << t.name;
    EXPECT_EQ(ck.locate(t.name).entry->shape, t.shape) << t.name;
  }
  for (const auto& n : ck.tensor_names()) EXPECT_TRUE(in_table.count(n)) << "not in table: " << n;
  const auto* proj = table->find("single_transformer_blocks.0.proj_out.weight");
  ASSERT_NE(proj, nullptr);
  EXPECT_EQ(proj->style, ShardStyle::PackedRowwise);
  EXPECT_EQ(proj->blocks, (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(table->find("transformer_blocks.1.attn.to_out.0.bias")->style, ShardStyle::Replicated);
  EXPECT_EQ(table->find("transformer_blocks.1.ff.net.0.proj.bias")->style, ShardStyle::Colwise);
}

}  // namespace
}  // namespace tprun::checkpoint
