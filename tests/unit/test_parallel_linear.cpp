// ParallelLinear, every style, with the p ranks of a group simulated in one
// process: colwise outputs concatenated, row-wise partial sums added (what the
// AllReduce does) plus the bias once, equal the unsharded Linear.
#include <filesystem>
#include <map>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/shard_loader.h"
#include "checkpoint/tensor_file.h"
#include "parallel/parallel_linear.h"

namespace tprun::parallel {
namespace {

namespace fs = std::filesystem;
using checkpoint::ShardRequest;
using checkpoint::ShardStyle;

class ParallelLinearTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = fs::temp_directory_path() / ("tprun_parallel_linear_" + std::to_string(::getpid()) + ".safetensors");
    w_ = at::randn({12, 24});  // N 12, K 24 = packed blocks [8, 16]
    b_ = at::randn({12});
    x_ = at::randn({2, 3, 24});
    checkpoint::write_tensor_file_f32(file_.string(), {{"l.weight", w_}, {"l.bias", b_}});
    ck_ = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(file_.string()));
  }
  void TearDown() override { fs::remove(file_); }

  ParallelLinear load(ShardStyle style, int r, int p, std::vector<int64_t> blocks = {}) {
    checkpoint::SafetensorsSource source(ck_);
    checkpoint::ShardLoader loader(source, {});
    ShardRequest w{style, r, p, blocks, !blocks.empty()};
    const bool row = style != ShardStyle::Replicated && style != ShardStyle::Colwise;
    ShardRequest b{row ? ShardStyle::Replicated : style, r, p, {}, false};
    return ParallelLinear::load(loader, "l", w, true, b);
  }
  at::Tensor full() const { return at::linear(x_, w_, b_); }

  fs::path file_;
  at::Tensor w_, b_, x_;
  std::shared_ptr<const checkpoint::ComponentCheckpoint> ck_;
};

TEST_F(ParallelLinearTest, ReplicatedIsAPlainLinear) {
  auto l = load(ShardStyle::Replicated, 0, 1);
  EXPECT_FALSE(l.partial_output());
  EXPECT_TRUE(at::allclose(l.forward(x_), full(), 1e-5, 1e-5));
}

TEST_F(ParallelLinearTest, ColwiseOutputsConcatenate) {
  for (int p : {1, 2, 4}) {
    std::vector<at::Tensor> outs;
    for (int r = 0; r < p; ++r) outs.push_back(load(ShardStyle::Colwise, r, p).forward(x_));
    EXPECT_TRUE(at::allclose(at::cat(outs, -1), full(), 1e-5, 1e-5)) << "p " << p;
  }
}

TEST_F(ParallelLinearTest, RowwisePartialsSumThenBiasOnce) {
  for (int p : {1, 2, 4}) {
    at::Tensor sum = at::zeros({2, 3, 12});
    ParallelLinear last;
    for (int r = 0; r < p; ++r) {
      last = load(ShardStyle::Rowwise, r, p);
      EXPECT_TRUE(last.partial_output());
      sum = sum + last.forward(x_.narrow(-1, r * 24 / p, 24 / p));
    }
    EXPECT_TRUE(at::allclose(last.add_bias(sum), full(), 1e-5, 1e-5)) << "p " << p;
  }
}

TEST_F(ParallelLinearTest, RowwiseSplitInputTakesItsSliceOfAReplicatedInput) {
  for (int p : {1, 2, 4}) {
    at::Tensor sum = at::zeros({2, 3, 12});
    ParallelLinear last;
    for (int r = 0; r < p; ++r) {
      last = load(ShardStyle::RowwiseSplitInput, r, p);
      sum = sum + last.forward(x_);  // the whole input on every rank
    }
    EXPECT_TRUE(at::allclose(last.add_bias(sum), full(), 1e-5, 1e-5)) << "p " << p;
  }
}

TEST_F(ParallelLinearTest, PackedRowwiseSplitsEachBlockOnItsOwn) {
  for (int p : {1, 2, 4}) {
    at::Tensor sum = at::zeros({2, 3, 12});
    ParallelLinear last;
    for (int r = 0; r < p; ++r) {
      last = load(ShardStyle::PackedRowwise, r, p, {8, 16});
      // This rank's input: its part of block 0, then its part of block 1.
      at::Tensor xr = at::cat({x_.narrow(-1, r * 8 / p, 8 / p), x_.narrow(-1, 8 + r * 16 / p, 16 / p)}, -1);
      sum = sum + last.forward(xr);
    }
    EXPECT_TRUE(at::allclose(last.add_bias(sum), full(), 1e-5, 1e-5)) << "p " << p;
  }
}

}  // namespace
}  // namespace tprun::parallel
