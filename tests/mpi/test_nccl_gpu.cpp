// NCCL backend on CUDA tensors. Skipped (reported as skipped) where no GPU is
// visible; run by ctest -L gpu on a machine with one.
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/device_mesh.h"
#include "dist/nccl_communicator.h"
#include "runtime/device.h"

namespace tprun::dist {
namespace {

// Ranks of this node (NCCL needs a GPU of its own for each).
int ranks_on_this_node() {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int n = 1;
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return n;
}

TEST(GpuNccl, CollectivesOnCudaTensors) {
  if (!nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  const int gpus = cuda_device_count();
  const int local = ranks_on_this_node();
  // Decided together: a rank that skipped would leave the others waiting in NCCL's bootstrap.
  int skip = gpus == 0 || local > gpus ? 1 : 0, any_skip = 0;
  MPI_Allreduce(&skip, &any_skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_skip != 0) {
    if (gpus == 0) GTEST_SKIP() << "no GPU visible";
    GTEST_SKIP() << local << " ranks on this node share " << gpus
                 << " GPU(s): NCCL refuses two ranks on one GPU (GpuStagedMpi covers this case)";
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MeshContext ctx;
  ctx.cuda_device = rank % gpus;
  ctx.watchdog = CommWatchdog::global();
  auto mesh = DeviceMesh::create({world, 0, false}, ctx);
  Communicator& c = mesh->tp_device();
  EXPECT_STREQ(c.backend(), "nccl");
  const auto dev = at::TensorOptions().device(at::kCUDA, ctx.cuda_device);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor t = at::full({1000003}, static_cast<double>(rank + 1), dev.dtype(dt));
    c.all_reduce(t);
    const double expect = world * (world + 1) / 2.0;
    EXPECT_TRUE(at::allclose(t.cpu().to(at::kFloat), at::full({1000003}, expect)));
    at::Tensor m = at::full({5}, static_cast<double>(rank), dev.dtype(dt));
    c.all_reduce(m, {ReduceOp::Max});
    EXPECT_EQ(m.cpu().to(at::kFloat)[0].item<float>(), static_cast<float>(world - 1));
    at::Tensor g = c.all_gather(at::full({2, 3}, static_cast<double>(rank), dev.dtype(dt)), {1});
    EXPECT_EQ(g.size(1), 3 * world);
    at::Tensor b = at::full({7}, rank == 0 ? 42.0 : 0.0, dev.dtype(dt));
    c.broadcast(b, {0});
    EXPECT_EQ(b.cpu().to(at::kFloat)[6].item<float>(), 42.0f);
  }
  c.barrier();
  EXPECT_EQ(c.stats()[CollectiveKind::AllReduce].calls, 6u);
}

}  // namespace
}  // namespace tprun::dist
