#pragma once
// Per-communicator counters of collective calls and payload bytes. Tests use
// them to prove that a TP forward issues exactly the AllReduces its plan
// implies; `tprun bench` reports them.

#include <array>
#include <cstdint>
#include <string>

namespace tprun::dist {

enum class CollectiveKind : int { AllReduce = 0, AllGather, Broadcast, Barrier, Count };

const char* collective_name(CollectiveKind kind);

struct CollectiveCounter {
  uint64_t calls = 0;
  uint64_t bytes = 0;  // payload this rank contributed (input bytes)
};

class CollectiveStats {
 public:
  void record(CollectiveKind kind, uint64_t bytes) {
    auto& c = counters_[static_cast<size_t>(kind)];
    ++c.calls;
    c.bytes += bytes;
  }
  const CollectiveCounter& operator[](CollectiveKind kind) const {
    return counters_[static_cast<size_t>(kind)];
  }
  void reset() { counters_ = {}; }
  // "all_reduce 12 calls 3.0 MiB, all_gather 0 calls ..."
  std::string summary() const;

 private:
  std::array<CollectiveCounter, static_cast<size_t>(CollectiveKind::Count)> counters_{};
};

}  // namespace tprun::dist
