#include <set>

#include <gtest/gtest.h>

#include "dist/mesh.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {

std::string error_of(int world, MeshSpec spec, std::vector<int> nodes = {}) {
  try {
    plan_mesh(world, spec, nodes);
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.all_ranks()) << "mesh errors are raised identically on every rank";
    return e.what();
  }
  return "";
}

TEST(Mesh, EveryLayoutOfWorldOneToEight) {
  for (int world = 1; world <= 8; ++world) {
    for (int tp = 1; tp <= 8; ++tp) {
      SCOPED_TRACE(testing::Message() << "world " << world << " tp " << tp);
      if (world % tp != 0) {
        EXPECT_NE(error_of(world, {tp, 0, false}).find(
                      "world " + std::to_string(world) + " is not divisible by tp " + std::to_string(tp)),
                  std::string::npos);
        continue;
      }
      MeshLayout m = plan_mesh(world, {tp, 0, false});
      EXPECT_EQ(m.dp * m.tp, world);
      EXPECT_EQ(m.dp, world / tp);
      ASSERT_EQ(static_cast<int>(m.tp_groups.size()), m.dp);
      std::set<int> seen;
      for (int g = 0; g < m.dp; ++g) {
        ASSERT_EQ(static_cast<int>(m.tp_groups[g].size()), tp);
        for (int t = 0; t < tp; ++t) {
          const int r = m.tp_groups[g][t];
          EXPECT_EQ(r, g * tp + t) << "one node: TP groups are consecutive ranks";
          EXPECT_EQ(m.coord(r).dp_index, g);
          EXPECT_EQ(m.coord(r).tp_index, t);
          seen.insert(r);
        }
        EXPECT_FALSE(m.group_spans_nodes[g]);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), world);
      for (int r = 0; r < world; ++r) {
        auto peers = m.dp_peers_of(r);
        ASSERT_EQ(static_cast<int>(peers.size()), m.dp);
        for (int g = 0; g < m.dp; ++g) EXPECT_EQ(peers[g], g * tp + r % tp);
      }
      // An explicit dp that matches is accepted.
      EXPECT_NO_THROW(plan_mesh(world, {tp, world / tp, false}));
    }
  }
}

TEST(Mesh, ErrorsNameTheNumbers) {
  EXPECT_NE(error_of(6, {4, 0, false}).find("world 6 is not divisible by tp 4"), std::string::npos);
  EXPECT_NE(error_of(6, {2, 2, false}).find("dp 2 x tp 2 = 4 does not match world 6"), std::string::npos);
  EXPECT_NE(error_of(4, {0, 0, false}).find("tp must be at least 1 (got 0)"), std::string::npos);
  EXPECT_NE(error_of(4, {1, -1, false}).find("dp must be at least 1"), std::string::npos);
}

TEST(Mesh, GroupsStayInsideNodes) {
  // Two nodes of four ranks, block placement.
  std::vector<int> nodes{0, 0, 0, 0, 1, 1, 1, 1};
  MeshLayout m = plan_mesh(8, {4, 0, false}, nodes);
  EXPECT_EQ(m.tp_groups[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m.tp_groups[1], (std::vector<int>{4, 5, 6, 7}));
  std::string err = error_of(8, {8, 0, false}, nodes);
  EXPECT_NE(err.find("would span nodes"), std::string::npos) << err;
  EXPECT_NE(err.find("allow_cross_node_tp"), std::string::npos) << err;
  MeshLayout cross = plan_mesh(8, {8, 0, true}, nodes);
  EXPECT_TRUE(cross.group_spans_nodes[0]);
}

TEST(Mesh, RoundRobinPlacementStillGroupsByNode) {
  // mpirun --map-by node: even ranks on node 0, odd on node 1.
  std::vector<int> nodes{0, 1, 0, 1, 0, 1, 0, 1};
  MeshLayout m = plan_mesh(8, {2, 0, false}, nodes);
  EXPECT_EQ(m.tp_groups[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(m.tp_groups[1], (std::vector<int>{4, 6}));
  EXPECT_EQ(m.tp_groups[2], (std::vector<int>{1, 3}));
  EXPECT_EQ(m.tp_groups[3], (std::vector<int>{5, 7}));
  for (bool s : m.group_spans_nodes) EXPECT_FALSE(s);
  EXPECT_EQ(m.dp_peers_of(3), (std::vector<int>{2, 6, 3, 7}));
}

TEST(Mesh, UnevenNodesRejectAGroupAcrossTheBoundary) {
  std::vector<int> nodes{0, 0, 0, 1};
  std::string err = error_of(4, {2, 0, false}, nodes);
  EXPECT_NE(err.find("tp group 1 (ranks [2,3])"), std::string::npos) << err;
  EXPECT_NE(err.find("node 0: 3, node 1: 1"), std::string::npos) << err;
}

}  // namespace
}  // namespace tprun::dist
