#include "dist/collective_stats.h"

#include <fmt/format.h>

namespace tprun::dist {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::Count: break;
  }
  return "?";
}

std::string CollectiveStats::summary() const {
  std::string out;
  for (int k = 0; k < static_cast<int>(CollectiveKind::Count); ++k) {
    const auto& c = counters_[static_cast<size_t>(k)];
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {} calls {:.1f} KiB", collective_name(static_cast<CollectiveKind>(k)),
                       c.calls, static_cast<double>(c.bytes) / 1024.0);
  }
  return out;
}

}  // namespace tprun::dist
