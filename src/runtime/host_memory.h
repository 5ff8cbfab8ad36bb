#pragma once
// How much memory this process may still allocate, from every limit that can
// stop it: the cgroup's memory limit (v2 memory.max, v1
// memory.limit_in_bytes, the tightest of the process's cgroup and its
// ancestors) minus what the cgroup holds apart from page cache, the
// address-space limit (`ulimit -v`, RLIMIT_AS) minus this process's VmSize,
// the kernel's MemAvailable, and on CUDA the device's free memory. Read from
// /proc and /sys at the moment of the call; nothing is cached.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tprun {

// One limit: how many bytes are left under it and where that came from.
struct MemoryLimit {
  std::string name;     // "cgroup memory.max", "RLIMIT_AS (ulimit -v)", "MemAvailable", "cuda:0 free"
  uint64_t limit = 0;   // the limit itself (bytes; 0 where it has none, as MemAvailable)
  uint64_t used = 0;    // what counts against it now (bytes)
  uint64_t available = 0;
  bool shared = false;  // shared with the other processes of the node (cgroup, MemAvailable)
};

struct HostMemory {
  std::vector<MemoryLimit> limits;  // every limit found; none where nothing could be read
  // The smallest `available` of the limits (nullopt: no limit known). A
  // limit shared by the node's processes counts only 1 / `sharing` of it.
  std::optional<uint64_t> available(int sharing = 1) const;
  // The limit that gives available(sharing).
  const MemoryLimit* tightest(int sharing = 1) const;
};

// The host limits of this process (cgroup, RLIMIT_AS, MemAvailable).
HostMemory host_memory();
// For cuda_index < 0 host_memory(); else that device's memory only (the
// activations live there): free memory plus what libtorch's caching
// allocator holds unused (CUDA builds; none known in a build without CUDA).
HostMemory device_memory(int cuda_index);

// Parsers, exposed for the tests. "max" / absent -> nullopt.
std::optional<uint64_t> parse_cgroup_limit(const std::string& text);
// The "VmSize:   1234 kB" line of /proc/<pid>/status -> bytes.
std::optional<uint64_t> parse_status_kb(const std::string& status, const std::string& key);
// A line of this process's /proc/self/status in bytes ("VmRSS", "VmHWM",
// "VmSize"); 0 where it cannot be read.
uint64_t self_status_bytes(const std::string& key);
// "1.5 GiB", "512 MiB" for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace tprun
