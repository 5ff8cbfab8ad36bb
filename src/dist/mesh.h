#pragma once
// The device mesh as arithmetic: dp x tp = world. Pure functions, no MPI, so
// every layout can be unit-tested.
//
// Ranks are ordered by (node, world rank) and cut into TP groups of `tp`
// consecutive ranks of that order. With the usual block placement (mpirun's
// --map-by slot, srun's block distribution) a TP group is simply consecutive
// world ranks on one node. Group g is DP replica g; the DP peers of a rank
// are the ranks with the same position (tp index) in every group.

#include <string>
#include <vector>

namespace tprun::dist {

struct MeshSpec {
  int tp = 1;
  int dp = 0;  // 0: world / tp
  bool allow_cross_node_tp = false;
};

struct MeshCoord {
  int dp_index = 0;  // which replica (TP group)
  int tp_index = 0;  // position inside the TP group
};

struct MeshLayout {
  int world = 1;
  int tp = 1;
  int dp = 1;
  std::vector<std::vector<int>> tp_groups;  // [dp_index][tp_index] -> world rank
  std::vector<MeshCoord> coords;            // [world rank]
  std::vector<bool> group_spans_nodes;      // [dp_index]

  const MeshCoord& coord(int rank) const { return coords.at(static_cast<size_t>(rank)); }
  const std::vector<int>& tp_group_of(int rank) const {
    return tp_groups.at(static_cast<size_t>(coord(rank).dp_index));
  }
  // World ranks with the same tp index, in dp order.
  std::vector<int> dp_peers_of(int rank) const;
};

// Throws ConfigError (raised identically on every rank) naming the numbers:
// "world 6 is not divisible by tp 4", "dp 2 x tp 2 = 4 does not match world 6",
// or a TP group that would span nodes without allow_cross_node_tp.
// `node_of_rank` has one entry per world rank (empty: all on one node).
MeshLayout plan_mesh(int world, const MeshSpec& spec, const std::vector<int>& node_of_rank = {});

// "[0,1]"
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace tprun::dist
