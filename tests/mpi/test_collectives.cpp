// MPI backend collectives against results computed locally on every rank.
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/mpi_communicator.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Rank r's input, reproducible on every rank.
at::Tensor data_of(int rank, at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000 + static_cast<uint64_t>(rank));
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

// Every rank holds the same bytes as rank 0.
void expect_bitwise_identical(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  at::Tensor root = c.clone();
  MPI_Bcast(root.data_ptr(), static_cast<int>(root.numel() * root.element_size()), MPI_BYTE, 0,
            MPI_COMM_WORLD);
  int same = std::memcmp(root.data_ptr(), c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size())) == 0;
  int all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "results differ between ranks";
}

struct Case {
  at::ScalarType dtype;
  double atol, rtol;
};

class Collectives : public ::testing::Test {
 protected:
  void SetUp() override {
    comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", CommWatchdog::global());
  }
  std::unique_ptr<MpiCommunicator> comm;
};

const Case kCases[] = {{at::kFloat, 1e-5, 1e-5}, {at::kHalf, 2e-2, 1e-2}, {at::kBFloat16, 1e-1, 3e-2}};
const int64_t kSizes[] = {0, 1, 7, 1000, 4097, (1 << 20) + 3};

TEST_F(Collectives, AllReduceSumMatchesLocalSum) {
  const int n = comm->size();
  uint64_t seed = 11;
  for (const Case& c : kCases) {
    for (int64_t size : kSizes) {
      SCOPED_TRACE(testing::Message() << c10::toString(c.dtype) << " size " << size);
      at::Tensor t = data_of(comm->rank(), {size}, c.dtype, seed);
      at::Tensor expected = at::zeros({size}, at::kFloat);
      for (int r = 0; r < n; ++r) expected += data_of(r, {size}, c.dtype, seed).to(at::kFloat);
      comm->all_reduce(t);
      EXPECT_EQ(t.scalar_type(), c.dtype);
      EXPECT_TRUE(at::allclose(t.to(at::kFloat), expected, c.rtol, c.atol));
      if (c.dtype != at::kFloat || n <= 2) {
        // 16-bit types: accumulated in fp32 in rank order and rounded once,
        // exactly what the local sum gives. (fp32 with 2 ranks: one add.)
        EXPECT_TRUE(at::equal(t, expected.to(c.dtype)));
      }
      expect_bitwise_identical(t);
      ++seed;
    }
  }
}

TEST_F(Collectives, AllReduceMaxIsExact) {
  const int n = comm->size();
  for (const Case& c : kCases) {
    for (int64_t size : kSizes) {
      at::Tensor t = data_of(comm->rank(), {size}, c.dtype, 99);
      at::Tensor expected = data_of(0, {size}, c.dtype, 99);
      for (int r = 1; r < n; ++r) expected = at::maximum(expected, data_of(r, {size}, c.dtype, 99));
      comm->all_reduce(t, {ReduceOp::Max});
      EXPECT_TRUE(at::equal(t, expected)) << c10::toString(c.dtype) << " " << size;
      expect_bitwise_identical(t);
    }
  }
}

TEST_F(Collectives, AllReduceNonContiguousInPlace) {
  at::Tensor base = data_of(comm->rank(), {33, 17}, at::kFloat, 5);
  at::Tensor view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  at::Tensor expected = at::zeros({17, 33});
  for (int r = 0; r < comm->size(); ++r) expected += data_of(r, {33, 17}, at::kFloat, 5).t();
  comm->all_reduce(view);
  EXPECT_TRUE(at::allclose(view, expected, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(base.t(), expected, 1e-5, 1e-5)) << "the caller's storage is updated";
}

TEST_F(Collectives, AllReduceIntegers) {
  at::Tensor t = at::arange(10, at::kLong) * (comm->rank() + 1);
  comm->all_reduce(t);
  const int64_t n = comm->size();
  EXPECT_TRUE(at::equal(t, at::arange(10, at::kLong) * (n * (n + 1) / 2)));
}

TEST_F(Collectives, AllGatherAlongEachDim) {
  const int n = comm->size();
  for (const Case& c : kCases) {
    for (int64_t rows : {0, 1, 3}) {
      at::Tensor mine = data_of(comm->rank(), {rows, 5}, c.dtype, 21);
      std::vector<at::Tensor> parts;
      for (int r = 0; r < n; ++r) parts.push_back(data_of(r, {rows, 5}, c.dtype, 21));
      at::Tensor g0 = comm->all_gather(mine, {0});
      EXPECT_TRUE(at::equal(g0, at::cat(parts, 0)));
      at::Tensor g1 = comm->all_gather(mine, {1});
      EXPECT_TRUE(at::equal(g1, at::cat(parts, 1)));
      EXPECT_EQ(g1.size(1), 5 * n);
      at::Tensor gneg = comm->all_gather(mine, {-1});
      EXPECT_TRUE(at::equal(gneg, g1));
      expect_bitwise_identical(g1);
    }
  }
  EXPECT_THROW(comm->all_gather(at::zeros({2}), {3}), CommError);
}

TEST_F(Collectives, BroadcastFromFirstAndLastRank) {
  const int n = comm->size();
  for (const Case& c : kCases) {
    for (int64_t size : kSizes) {
      for (int root : {0, n - 1}) {
        at::Tensor t = comm->rank() == root ? data_of(root, {size}, c.dtype, 31)
                                            : at::zeros({size}, c.dtype);
        comm->broadcast(t, {root});
        EXPECT_TRUE(at::equal(t, data_of(root, {size}, c.dtype, 31)));
      }
    }
  }
  at::Tensor t = at::zeros({3});
  EXPECT_THROW(comm->broadcast(t, {n}), CommError);
}

TEST_F(Collectives, StatsCountCallsAndBytes) {
  comm->reset_stats();
  at::Tensor t = at::zeros({256}, at::kBFloat16);
  comm->all_reduce(t);
  comm->all_reduce(t);
  comm->broadcast(t);
  (void)comm->all_gather(t);
  comm->barrier();
  const auto& s = comm->stats();
  EXPECT_EQ(s[CollectiveKind::AllReduce].calls, 2u);
  EXPECT_EQ(s[CollectiveKind::AllReduce].bytes, 1024u);
  EXPECT_EQ(s[CollectiveKind::Broadcast].calls, 1u);
  EXPECT_EQ(s[CollectiveKind::AllGather].calls, 1u);
  EXPECT_EQ(s[CollectiveKind::AllGather].bytes, 512u);
  EXPECT_EQ(s[CollectiveKind::Barrier].calls, 1u);
}

TEST_F(Collectives, RejectsUnsupportedInput) {
  at::Tensor b = at::zeros({4}, at::kBool);
  EXPECT_THROW(comm->all_reduce(b), CommError);
  at::Tensor undefined;
  EXPECT_THROW(comm->all_reduce(undefined), CommError);
  (void)world_rank();
}

}  // namespace
}  // namespace tprun::dist
