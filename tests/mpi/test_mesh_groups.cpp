// DeviceMesh over the real MPI world: TP and DP sub-communicators.
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/device_mesh.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {

int world_size() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

TEST(MeshGroups, TpAndDpCommunicators) {
  const int world = world_size();
  for (int tp : {1, 2, 4}) {
    if (world % tp != 0) continue;
    SCOPED_TRACE(testing::Message() << "tp " << tp);
    MeshContext ctx;
    ctx.watchdog = CommWatchdog::global();
    auto mesh = DeviceMesh::create({tp, 0, false}, ctx);
    const int rank = mesh->world_rank();
    EXPECT_EQ(mesh->tp_size(), tp);
    EXPECT_EQ(mesh->dp_size(), world / tp);
    EXPECT_EQ(mesh->tp().size(), tp);
    EXPECT_EQ(mesh->dp().size(), world / tp);
    EXPECT_EQ(mesh->tp_rank(), rank % tp);
    EXPECT_EQ(mesh->dp_rank(), rank / tp);
    EXPECT_EQ(mesh->tp().rank(), mesh->tp_rank());
    EXPECT_EQ(mesh->dp().rank(), mesh->dp_rank());
    EXPECT_EQ(&mesh->tp_device(), &mesh->tp()) << "CPU ranks use the MPI communicator";

    // Sum of world ranks over the TP group = sum of its members.
    at::Tensor t = at::full({3}, static_cast<double>(rank), at::kDouble);
    mesh->tp().all_reduce(t);
    double expect_tp = 0;
    for (int r : mesh->layout().tp_group_of(rank)) expect_tp += r;
    EXPECT_EQ(t[0].item<double>(), expect_tp);

    at::Tensor d = at::full({3}, static_cast<double>(rank), at::kDouble);
    mesh->dp().all_reduce(d);
    double expect_dp = 0;
    for (int r : mesh->layout().dp_peers_of(rank)) expect_dp += r;
    EXPECT_EQ(d[2].item<double>(), expect_dp);
  }
}

TEST(MeshGroups, IndivisibleTpFailsOnEveryRank) {
  const int world = world_size();
  if (world < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const int tp = world + 1;
  MeshContext ctx;
  try {
    DeviceMesh::create({tp, 0, false}, ctx);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.all_ranks());
    EXPECT_NE(std::string(e.what()).find("is not divisible by tp"), std::string::npos);
  }
  // Every rank is still in step: a collective after the error completes.
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tprun::dist
