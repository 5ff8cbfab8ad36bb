// ParallelLinear, every style, over the real TP group of this run (tp = world
// size 1, 2, 4): colwise shards gathered, row-wise outputs reduced inside the
// layer with the bias added once, equal the unsharded Linear; several row-wise
// layers close with ONE AllReduce; the layers refuse what the style forbids.
#include <filesystem>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/shard_loader.h"
#include "checkpoint/tensor_file.h"
#include "dist/comm_watchdog.h"
#include "dist/mpi_communicator.h"
#include "parallel/matmul_trace.h"
#include "parallel/parallel_linear.h"
#include "runtime/error.h"

namespace tprun::parallel {
namespace {

namespace fs = std::filesystem;
using checkpoint::ShardRequest;
using checkpoint::ShardStyle;

class ParallelLinearTp : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = std::make_unique<dist::MpiCommunicator>(MPI_COMM_WORLD, "world", dist::CommWatchdog::global());
    tp_ = {comm_->rank(), comm_->size(), comm_->size() > 1 ? comm_.get() : nullptr};
    // Rank 0 writes one checkpoint (seeded, so every rank knows the full tensors too).
    at::manual_seed(7);
    w_ = at::randn({12, 24});  // N 12 = packed blocks [4, 8], K 24 = packed blocks [8, 16]
    b_ = at::randn({12});
    x_ = at::randn({2, 3, 24});
    int64_t token = static_cast<int64_t>(::getpid());
    MPI_Bcast(&token, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    file_ = fs::temp_directory_path() / ("tprun_parallel_linear_" + std::to_string(token) + ".safetensors");
    if (tp_.rank == 0) checkpoint::write_tensor_file_f32(file_.string(), {{"l.weight", w_}, {"l.bias", b_}});
    MPI_Barrier(MPI_COMM_WORLD);
    ck_ = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(file_.string()));
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (tp_.rank == 0) fs::remove(file_);
  }

  // This rank's layer of `style`, loaded through the shard loader as a model load does.
  ParallelLinear layer(ShardStyle style, std::vector<int64_t> blocks = {}) {
    checkpoint::SafetensorsSource source(ck_);
    checkpoint::ShardLoader loader(source, {});
    ShardRequest w{style, tp_.rank, tp_.size, blocks, !blocks.empty()};
    ShardRequest b{checkpoint::bias_style(style), tp_.rank, tp_.size, {}, false};
    if (checkpoint::split_dim(b.style) == 0) b.blocks = blocks, b.blocks_absolute = !blocks.empty();
    std::vector<int64_t> in_blocks;
    if (style == ShardStyle::PackedRowwise) in_blocks = blocks;
    else if (checkpoint::output_is_partial(style)) in_blocks = {24};
    return ParallelLinear("l", style, in_blocks, tp_, Weight("l.weight", resident_storage(loader.load("l.weight", w))),
                          Weight("l.bias", resident_storage(loader.load("l.bias", b))));
  }
  at::Tensor full() const { return at::linear(x_, w_, b_); }
  int p() const { return tp_.size; }
  int r() const { return tp_.rank; }

  std::unique_ptr<dist::MpiCommunicator> comm_;
  TpContext tp_;
  fs::path file_;
  at::Tensor w_, b_, x_;
  std::shared_ptr<const checkpoint::ComponentCheckpoint> ck_;
};

TEST_F(ParallelLinearTp, ReplicatedIsAPlainLinear) {
  EXPECT_TRUE(at::allclose(layer(ShardStyle::Replicated).forward(x_), full(), 1e-5, 1e-5));
}

TEST_F(ParallelLinearTp, ColwiseShardsGatherToTheFullOutput) {
  at::Tensor mine = layer(ShardStyle::Colwise).forward(x_);
  EXPECT_EQ(mine.size(-1), 12 / p());
  EXPECT_TRUE(at::allclose(comm_->all_gather(mine.contiguous(), {2}), full(), 1e-5, 1e-5));
}

TEST_F(ParallelLinearTp, PackedColwiseGivesEachRankItsShareOfEveryBlock) {
  at::Tensor mine = layer(ShardStyle::PackedColwise, {4, 8}).forward(x_);
  const at::Tensor f = full();
  // [block 0 share | block 1 share]; a plain split would give rank 0 all of block 0.
  at::Tensor want = at::cat({f.narrow(-1, r() * 4 / p(), 4 / p()), f.narrow(-1, 4 + r() * 8 / p(), 8 / p())}, -1);
  EXPECT_TRUE(at::allclose(mine, want, 1e-5, 1e-5));
}

TEST_F(ParallelLinearTp, RowwiseReducesAndAddsTheBiasOnce) {
  comm_->reset_stats();
  at::Tensor out = layer(ShardStyle::Rowwise).forward(x_.narrow(-1, r() * 24 / p(), 24 / p()));
  EXPECT_TRUE(at::allclose(out, full(), 1e-5, 1e-5));
  EXPECT_EQ(comm_->stats()[dist::CollectiveKind::AllReduce].calls, p() > 1 ? 1u : 0u);
}

TEST_F(ParallelLinearTp, RowwiseSplitInputTakesItsSliceOfAReplicatedInput) {
  EXPECT_TRUE(at::allclose(layer(ShardStyle::RowwiseSplitInput).forward(x_), full(), 1e-5, 1e-5));
}

TEST_F(ParallelLinearTp, PackedRowwiseSplitsEachBlockOnItsOwn) {
  // This rank's input: its part of block 0, then its part of block 1.
  at::Tensor xr = at::cat({x_.narrow(-1, r() * 8 / p(), 8 / p()), x_.narrow(-1, 8 + r() * 16 / p(), 16 / p())}, -1);
  EXPECT_TRUE(at::allclose(layer(ShardStyle::PackedRowwise, {8, 16}).forward(xr), full(), 1e-5, 1e-5));
}

TEST_F(ParallelLinearTp, SeveralRowwiseLayersShareOneAllReduce) {
  ParallelLinear a = layer(ShardStyle::Rowwise), b = layer(ShardStyle::RowwiseSplitInput);
  const at::Tensor xa = x_.narrow(-1, r() * 24 / p(), 24 / p()), xb = x_ * 2;
  comm_->reset_stats();
  auto out = rowwise_forward(RowwiseBatch().add(a, xa).add(b, xb));
  EXPECT_EQ(comm_->stats()[dist::CollectiveKind::AllReduce].calls, p() > 1 ? 1u : 0u);
  EXPECT_TRUE(at::allclose(out[0], full(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(out[1], at::linear(xb, w_, b_), 1e-5, 1e-5));
}

TEST_F(ParallelLinearTp, RowwiseForwardRefusesAColwiseLayer) {
  ParallelLinear c = layer(ShardStyle::Colwise);
  EXPECT_THROW(rowwise_forward(RowwiseBatch().add(c, x_)), Error);
}

TEST_F(ParallelLinearTp, UndefinedLayersAndWeightsSayWhich) {
  Weight none;
  EXPECT_FALSE(none.defined());
  try {
    (void)Weight("x.weight", nullptr).get();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.weight"), std::string::npos);
  }
  EXPECT_FALSE(ParallelLinear().defined());
}

TEST_F(ParallelLinearTp, MatmulRecorderSeesThisRanksShapes) {
  ParallelLinear c = layer(ShardStyle::Colwise);
  MatmulRecorder rec;
  (void)c.forward(x_);
  ASSERT_EQ(rec.shapes().size(), 1u);
  EXPECT_EQ(rec.shapes()[0].m, 6);
  EXPECT_EQ(rec.shapes()[0].k, 24);
  EXPECT_EQ(rec.shapes()[0].n, 12 / p());
  EXPECT_EQ(rec.shapes()[0].tp_share, p());
}

}  // namespace
}  // namespace tprun::parallel
