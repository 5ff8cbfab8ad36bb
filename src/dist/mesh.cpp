#include "dist/mesh.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::dist {

std::string format_ranks(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ","));
}

std::vector<int> MeshLayout::dp_peers_of(int rank) const {
  const int t = coord(rank).tp_index;
  std::vector<int> peers;
  peers.reserve(tp_groups.size());
  for (const auto& g : tp_groups) peers.push_back(g[static_cast<size_t>(t)]);
  return peers;
}

MeshLayout plan_mesh(int world, const MeshSpec& spec, const std::vector<int>& node_of_rank) {
  if (world < 1) throw ConfigError(fmt::format("world {} must be at least 1", world), true);
  if (spec.tp < 1) throw ConfigError(fmt::format("tp must be at least 1 (got {})", spec.tp), true);
  if (spec.dp < 0) throw ConfigError(fmt::format("dp must be at least 1 (got {})", spec.dp), true);
  if (world % spec.tp != 0) {
    throw ConfigError(fmt::format("world {} is not divisible by tp {}: start a multiple of {} ranks "
                                  "or choose a tp that divides {}",
                                  world, spec.tp, spec.tp, world),
                      true);
  }
  const int dp = world / spec.tp;
  if (spec.dp != 0 && spec.dp != dp) {
    throw ConfigError(fmt::format("dp {} x tp {} = {} does not match world {}", spec.dp, spec.tp,
                                  spec.dp * spec.tp, world),
                      true);
  }
  std::vector<int> node = node_of_rank;
  if (node.empty()) node.assign(static_cast<size_t>(world), 0);
  if (static_cast<int>(node.size()) != world) {
    throw ConfigError(fmt::format("mesh: {} node entries for world {}", node.size(), world), true);
  }

  std::vector<int> order(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) order[static_cast<size_t>(r)] = r;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return node[static_cast<size_t>(a)] < node[static_cast<size_t>(b)];
  });

  MeshLayout m;
  m.world = world;
  m.tp = spec.tp;
  m.dp = dp;
  m.coords.resize(static_cast<size_t>(world));
  for (int g = 0; g < dp; ++g) {
    std::vector<int> group(order.begin() + g * spec.tp, order.begin() + (g + 1) * spec.tp);
    bool spans = false;
    for (int r : group) spans |= node[static_cast<size_t>(r)] != node[static_cast<size_t>(group[0])];
    if (spans && !spec.allow_cross_node_tp) {
      std::map<int, int> per_node;
      for (int n : node) ++per_node[n];
      std::vector<std::string> counts;
      for (auto& [n, c] : per_node) counts.push_back(fmt::format("node {}: {}", n, c));
      throw ConfigError(
          fmt::format("tp group {} (ranks {}) would span nodes (ranks per node: {}); tp {} must "
                      "divide the ranks of every node, or set allow_cross_node_tp = true to "
                      "accept TP traffic between nodes",
                      g, format_ranks(group), fmt::join(counts, ", "), spec.tp),
          true);
    }
    for (int t = 0; t < spec.tp; ++t) m.coords[static_cast<size_t>(group[static_cast<size_t>(t)])] = {g, t};
    m.tp_groups.push_back(std::move(group));
    m.group_spans_nodes.push_back(spans);
  }
  return m;
}

}  // namespace tprun::dist
