// The tensor-parallel T5 encoder against transformers' reference
// (tests/data/t5_encoder): tp = world size (1, 2, 4 divide num_heads 4),
// within 1e-4 on every rank, bitwise identical across the group, each rank
// reading less than the whole checkpoint at tp > 1, and the AllReduce count
// the plan implies (2 per block at tp > 1, none at tp 1).
#include <cstdio>
#include <filesystem>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_source.h"
#include "dist/comm_watchdog.h"
#include "dist/mpi_communicator.h"
#include "models/model_config.h"  // read_component_config
#include "models/t5_encoder.h"
#include "rank_checks.h"
#include "test_data.h"

namespace tprun::models {
namespace {

namespace fs = std::filesystem;

fs::path data_dir() { return test::data_dir("t5_encoder"); }

std::unique_ptr<T5Encoder> load_t5(const parallel::TpContext& tp, const ModelOptions& opts = {}) {
  const fs::path dir = data_dir() / "text_encoder_2";
  std::string cfg_path;
  auto cfg = read_component_config(dir.string(), &cfg_path);
  auto source = checkpoint::open_weight_source(dir.string());
  return T5Encoder::load(*source, cfg, cfg_path, tp, opts);
}

class T5Tp : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(data_dir() / "expected.safetensors"))
        << "committed reference data missing: " << data_dir() / "expected.safetensors";
    comm_ = std::make_unique<dist::MpiCommunicator>(MPI_COMM_WORLD, "world", dist::CommWatchdog::global());
    tp_ = {comm_->rank(), comm_->size(), comm_.get()};
    if (4 % tp_.size != 0) GTEST_SKIP() << "the reference T5 has 4 heads";
    ids_ = checkpoint::read_tensor_file((data_dir() / "inputs.safetensors").string()).at("input_ids");
    expected_ = checkpoint::read_tensor_file((data_dir() / "expected.safetensors").string()).at("last_hidden_state");
  }
  void expect_identical_across_ranks(const at::Tensor& out) { test::expect_identical_across_ranks(*comm_, out); }
  std::unique_ptr<dist::MpiCommunicator> comm_;
  parallel::TpContext tp_;
  at::Tensor ids_, expected_;
};

TEST_F(T5Tp, MatchesTransformersAtTpEqualWorld) {
  auto m = load_t5(tp_);
  const auto whole = load_t5(parallel::TpContext{});  // local, unsharded
  if (tp_.size > 1) {
    EXPECT_LT(m->bytes_loaded(), whole->bytes_loaded()) << "rank " << tp_.rank;
  } else {
    EXPECT_EQ(m->bytes_loaded(), whole->bytes_loaded());
  }
  comm_->reset_stats();
  at::Tensor out = m->encode(ids_);
  const uint64_t reduces = comm_->stats()[dist::CollectiveKind::AllReduce].calls;
  const double d = at::abs(out - expected_).max().item<double>();
  if (tp_.rank == 0) {
    std::printf("[t5] tp=%d max abs diff vs transformers %.3g; rank 0 read %llu of %llu bytes; %llu AllReduces\n",
                tp_.size, d, static_cast<unsigned long long>(m->bytes_loaded()),
                static_cast<unsigned long long>(whole->bytes_loaded()), static_cast<unsigned long long>(reduces));
  }
  EXPECT_LE(d, 1e-4) << "rank " << tp_.rank;
  const uint64_t plan = tp_.size == 1 ? 0 : 2 * 2;  // 2 blocks
  EXPECT_EQ(static_cast<uint64_t>(m->all_reduces_per_forward()), plan);
  EXPECT_EQ(reduces, plan);
  EXPECT_EQ(comm_->stats()[dist::CollectiveKind::AllGather].calls, 0u);
  expect_identical_across_ranks(out);
}

// Half precision at tp = world against the local fp32 forward (bf16 1e-1,
// fp16 2e-2 on O(1) outputs); identical across the group.
TEST_F(T5Tp, HalfPrecisionSharded) {
  const at::Tensor ref = load_t5(parallel::TpContext{})->encode(ids_);
  for (auto [dtype, tol] : {std::pair<const char*, double>{"bf16", 1e-1}, {"fp16", 2e-2}}) {
    ModelOptions o;
    o.dtype = dtype;
    at::Tensor out = load_t5(tp_, o)->encode(ids_);
    const double d = at::abs(out.to(at::kFloat) - ref).max().item<double>();
    if (tp_.rank == 0) std::printf("[t5] tp=%d %s max abs diff vs fp32 %.3g\n", tp_.size, dtype, d);
    EXPECT_LE(d, tol) << dtype;
    expect_identical_across_ranks(out);
  }
}

}  // namespace
}  // namespace tprun::models
