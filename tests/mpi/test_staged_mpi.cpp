// StagedMpiCommunicator (`--comm mpi`): CPU tensors pass straight to MPI and
// give exactly the plain MPI communicator's results; CUDA tensors (Gpu* cases,
// skipped without a GPU) are staged through pinned host memory and give the
// same bytes as the plain communicator on host copies of the same inputs.
#include <memory>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/device_mesh.h"
#include "dist/mpi_communicator.h"
#include "dist/staged_mpi_communicator.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {

// Rank r's input, reproducible on every rank.
at::Tensor data_of(int rank, at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000 + static_cast<uint64_t>(rank));
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

std::unique_ptr<StagedMpiCommunicator> make_staged() {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  return std::make_unique<StagedMpiCommunicator>(
      std::make_unique<MpiCommunicator>(dup, "world", CommWatchdog::global()));
}

// True on every rank when any rank says true: a case that skips on one rank
// and runs its collectives on another would hang.
bool any_rank(bool mine) {
  int in = mine ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out != 0;
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kHalf, at::kBFloat16};
const int64_t kSizes[] = {0, 1, 7, 4097, (1 << 20) + 3};

class StagedMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    plain = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", CommWatchdog::global());
    staged = make_staged();
  }
  std::unique_ptr<MpiCommunicator> plain;
  std::unique_ptr<StagedMpiCommunicator> staged;
};

TEST_F(StagedMpi, NamesItselfAndItsGroup) {
  EXPECT_STREQ(staged->backend(), "mpi-staged");
  EXPECT_EQ(staged->name(), "world");
  EXPECT_EQ(staged->rank(), plain->rank());
  EXPECT_EQ(staged->size(), plain->size());
}

TEST_F(StagedMpi, CpuAllReduceMatchesPlainMpi) {
  uint64_t seed = 3;
  for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        SCOPED_TRACE(testing::Message() << c10::toString(dt) << " size " << n << " op " << static_cast<int>(op));
        at::Tensor a = data_of(staged->rank(), {n}, dt, seed);
        at::Tensor b = a.clone();
        staged->all_reduce(a, {op});
        plain->all_reduce(b, {op});
        EXPECT_TRUE(at::equal(a, b));
        ++seed;
      }
    }
  }
  at::Tensor i = at::arange(10, at::kLong) * (staged->rank() + 1);
  staged->all_reduce(i);
  const int64_t w = staged->size();
  EXPECT_TRUE(at::equal(i, at::arange(10, at::kLong) * (w * (w + 1) / 2)));
}

TEST_F(StagedMpi, CpuAllReduceNonContiguousInPlace) {
  at::Tensor base = data_of(staged->rank(), {33, 17}, at::kFloat, 5);
  at::Tensor ref = base.clone();
  at::Tensor view = base.t();
  at::Tensor ref_view = ref.t();
  staged->all_reduce(view);
  plain->all_reduce(ref_view);
  EXPECT_TRUE(at::equal(base, ref)) << "the caller's storage is updated";
}

TEST_F(StagedMpi, CpuAllGatherAndBroadcastMatchPlainMpi) {
  const int w = staged->size();
  for (auto dt : kDtypes) {
    for (int64_t rows : {0, 1, 3}) {
      at::Tensor mine = data_of(staged->rank(), {rows, 5}, dt, 21);
      for (int64_t dim : {0, 1, -1}) {
        at::Tensor a = staged->all_gather(mine, {dim});
        at::Tensor b = plain->all_gather(mine, {dim});
        EXPECT_TRUE(at::equal(a, b)) << c10::toString(dt) << " rows " << rows << " dim " << dim;
      }
    }
    for (int root : {0, w - 1}) {
      at::Tensor src = data_of(root, {1000}, dt, 31);
      at::Tensor a = staged->rank() == root ? src.clone() : at::zeros({1000}, dt);
      staged->broadcast(a, {root});
      EXPECT_TRUE(at::equal(a, src)) << c10::toString(dt) << " root " << root;
    }
  }
  staged->barrier();
}

TEST_F(StagedMpi, CpuStatsCountEachCallOnce) {
  staged->reset_stats();
  at::Tensor t = at::zeros({256}, at::kBFloat16);
  staged->all_reduce(t);
  staged->all_reduce(t);
  staged->broadcast(t);
  (void)staged->all_gather(t);
  staged->barrier();
  const auto& s = staged->stats();
  EXPECT_EQ(s[CollectiveKind::AllReduce].calls, 2u);
  EXPECT_EQ(s[CollectiveKind::AllReduce].bytes, 1024u);
  EXPECT_EQ(s[CollectiveKind::Broadcast].calls, 1u);
  EXPECT_EQ(s[CollectiveKind::Broadcast].bytes, 512u);
  EXPECT_EQ(s[CollectiveKind::AllGather].calls, 1u);
  EXPECT_EQ(s[CollectiveKind::AllGather].bytes, 512u);
  EXPECT_EQ(s[CollectiveKind::Barrier].calls, 1u);
  EXPECT_EQ(staged->staging_bytes(), 0u) << "CPU tensors are not staged";
}

TEST_F(StagedMpi, CpuRefusalsAreThoseOfMpi) {
  at::Tensor b = at::zeros({4}, at::kBool);
  EXPECT_THROW(staged->all_reduce(b), CommError);
  at::Tensor undefined;
  EXPECT_THROW(staged->all_reduce(undefined), CommError);
  EXPECT_THROW(staged->all_gather(at::zeros({2}), {3}), CommError);
  at::Tensor t = at::zeros({3});
  EXPECT_THROW(staged->broadcast(t, {staged->size()}), CommError);
  EXPECT_EQ(staged->stats()[CollectiveKind::AllReduce].calls, 0u) << "a refused call is not counted";
}

// A CUDA rank with --comm mpi: the mesh's device communicator is the staged
// one, its own communicator (counters apart from tp()). Building it touches
// no GPU, so this runs on CPU-only hosts too.
TEST(StagedMpiMesh, CommMpiGivesStagedDeviceCommunicator) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MeshContext ctx;
  ctx.cuda_device = 0;
  ctx.comm = CommChoice::Mpi;
  ctx.watchdog = CommWatchdog::global();
  EXPECT_STREQ(tp_device_backend(ctx), "mpi-staged");
  auto mesh = DeviceMesh::create({world, 0, false}, ctx);
  Communicator& dev = mesh->tp_device();
  EXPECT_STREQ(dev.backend(), "mpi-staged");
  EXPECT_NE(&dev, &mesh->tp());
  EXPECT_EQ(dev.size(), world);
  EXPECT_EQ(dev.name(), mesh->tp().name());
  at::Tensor t = at::arange(4, at::kFloat) + static_cast<double>(mesh->world_rank());
  dev.all_reduce(t);
  const double offset = world * (world - 1) / 2.0;
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat) * world + offset));
  EXPECT_EQ(dev.stats()[CollectiveKind::AllReduce].calls, 1u);
  EXPECT_EQ(mesh->tp().stats()[CollectiveKind::AllReduce].calls, 0u);

  ctx.cuda_device = -1;
  EXPECT_STREQ(tp_device_backend(ctx), "mpi") << "CPU ranks use MPI whatever --comm says";
  ctx.comm = CommChoice::Nccl;
  EXPECT_STREQ(tp_device_backend(ctx), "mpi");
}

TEST(StagedMpiMesh, CommChoiceNames) {
  for (auto c : {CommChoice::Auto, CommChoice::Nccl, CommChoice::Mpi}) {
    EXPECT_EQ(comm_choice_from_name(comm_choice_name(c)), c);
  }
  EXPECT_FALSE(comm_choice_from_name("gloo"));
  EXPECT_FALSE(comm_choice_from_name("MPI"));
  EXPECT_FALSE(comm_choice_from_name(""));
}

// CUDA tensors through the staged backend. Every rank may use the same GPU
// (rank % GPUs): the point of the backend is that it works where NCCL refuses.
TEST(GpuStagedMpi, CollectivesOnCudaTensors) {
  const int gpus = cuda_device_count();
  if (any_rank(gpus == 0)) GTEST_SKIP() << "no GPU visible";
  auto staged = make_staged();
  MpiCommunicator plain(MPI_COMM_WORLD, "world", CommWatchdog::global());
  const int rank = staged->rank();
  const int world = staged->size();
  const auto dev = at::TensorOptions().device(at::kCUDA, rank % gpus);
  uint64_t seed = 100;
  uint64_t reduces = 0, gathers = 0, broadcasts = 0;
  for (auto dt : kDtypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        SCOPED_TRACE(testing::Message() << c10::toString(dt) << " size " << n);
        at::Tensor host = data_of(rank, {n}, dt, seed++);
        at::Tensor d = host.to(dev);
        staged->all_reduce(d, {op});
        ++reduces;
        plain.all_reduce(host, {op});
        EXPECT_TRUE(d.is_cuda());
        EXPECT_EQ(d.scalar_type(), dt);
        EXPECT_TRUE(at::equal(d.cpu(), host)) << "the staged result differs from MPI's on the host";
      }
    }
    // Non-contiguous: the caller's storage is updated.
    at::Tensor base_host = data_of(rank, {33, 17}, dt, seed++);
    at::Tensor base = base_host.to(dev);
    at::Tensor view = base.t();
    staged->all_reduce(view);
    ++reduces;
    at::Tensor ref_view = base_host.t();
    plain.all_reduce(ref_view);
    EXPECT_TRUE(at::equal(base.cpu(), base_host));

    for (int64_t rows : {0, 1, 3}) {
      at::Tensor mine = data_of(rank, {rows, 5}, dt, 21);
      for (int64_t dim : {0, 1}) {
        at::Tensor g = staged->all_gather(mine.to(dev), {dim});
        ++gathers;
        EXPECT_TRUE(g.is_cuda());
        EXPECT_EQ(g.get_device(), rank % gpus);
        EXPECT_TRUE(at::equal(g.cpu(), plain.all_gather(mine, {dim}))) << "rows " << rows << " dim " << dim;
      }
    }
    for (int root : {0, world - 1}) {
      at::Tensor src = data_of(root, {4097}, dt, 31);
      at::Tensor b = (rank == root ? src : at::zeros({4097}, dt)).to(dev);
      staged->broadcast(b, {root});
      ++broadcasts;
      EXPECT_TRUE(at::equal(b.cpu(), src)) << "root " << root;
    }
  }
  staged->barrier();
  const auto& s = staged->stats();
  EXPECT_EQ(s[CollectiveKind::AllReduce].calls, reduces);
  EXPECT_EQ(s[CollectiveKind::AllGather].calls, gathers);
  EXPECT_EQ(s[CollectiveKind::Broadcast].calls, broadcasts);
  EXPECT_EQ(s[CollectiveKind::Barrier].calls, 1u);

  // The pinned buffer holds the largest tensor staged and is reused after.
  const size_t held = staged->staging_bytes();
  EXPECT_GE(held, static_cast<size_t>((1 << 20) + 3) * 4);
  at::Tensor small = at::zeros({10}, dev);
  staged->all_reduce(small);
  EXPECT_EQ(staged->staging_bytes(), held);

  // Refusals stay MPI's.
  at::Tensor b = at::zeros({4}, dev.dtype(at::kBool));
  EXPECT_THROW(staged->all_reduce(b), CommError);
}

}  // namespace
}  // namespace tprun::dist
