#include "runtime/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#ifdef TPRUN_TORCH_HAS_CUDA
#include <c10/core/CachingDeviceAllocator.h>
#endif

namespace tprun {
namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<uint64_t> read_number(const std::string& path) {
  auto t = read_text(path);
  if (!t) return std::nullopt;
  return parse_cgroup_limit(*t);
}

// "key value" lines (memory.stat) -> value of `key`.
std::optional<uint64_t> stat_value(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return std::nullopt;
}

// This process's cgroup path for `controller` ("" = the v2 unified line "0::").
std::optional<std::string> cgroup_path(const std::string& controller) {
  auto t = read_text("/proc/self/cgroup");
  if (!t) return std::nullopt;
  std::istringstream in(*t);
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctrls = line.substr(a + 1, b - a - 1);
    bool match = controller.empty() ? ctrls.empty() : false;
    if (!controller.empty()) {
      std::istringstream cs(ctrls);
      std::string c;
      while (std::getline(cs, c, ',')) match = match || c == controller;
    }
    if (match) return line.substr(b + 1);
  }
  return std::nullopt;
}

// The directories to read, innermost first: the process's own cgroup and its
// ancestors where the hierarchy is visible at `mount` + path, else the mount
// itself (a container sees its own cgroup as the mount's root).
std::vector<std::string> cgroup_dirs(const std::string& mount, const std::string& path, const std::string& probe) {
  std::vector<std::string> dirs;
  std::string p = path;
  while (!p.empty() && p != "/") {
    if (read_text(mount + p + "/" + probe)) dirs.push_back(mount + p);
    const auto slash = p.rfind('/');
    p = slash == std::string::npos || slash == 0 ? std::string() : p.substr(0, slash);
  }
  if (read_text(mount + "/" + probe)) dirs.push_back(mount);
  return dirs;
}

// The tightest cgroup limit: limit - (usage - page cache) at each level.
std::optional<MemoryLimit> cgroup_limit() {
  std::optional<MemoryLimit> best;
  auto consider = [&](const std::string& name, uint64_t limit, uint64_t usage, uint64_t file) {
    const uint64_t used = usage > file ? usage - file : 0;
    MemoryLimit l{name, limit, used, limit > used ? limit - used : 0, true};
    if (!best || l.available < best->available) best = l;
  };
  // v2
  if (auto path = cgroup_path("")) {
    for (const auto& dir : cgroup_dirs("/sys/fs/cgroup", *path, "memory.max")) {
      auto limit = read_number(dir + "/memory.max");
      auto usage = read_number(dir + "/memory.current");
      if (!limit || !usage) continue;
      const auto stat = read_text(dir + "/memory.stat");
      const uint64_t file = stat ? stat_value(*stat, "file").value_or(0) : 0;
      consider(dir + "/memory.max", *limit, *usage, file);
    }
  }
  // v1
  if (auto path = cgroup_path("memory")) {
    for (const auto& dir : cgroup_dirs("/sys/fs/cgroup/memory", *path, "memory.limit_in_bytes")) {
      auto limit = read_number(dir + "/memory.limit_in_bytes");
      auto usage = read_number(dir + "/memory.usage_in_bytes");
      // "No limit" in v1 is a page-rounded LLONG_MAX.
      if (!limit || !usage || *limit >= (uint64_t{1} << 62)) continue;
      const auto stat = read_text(dir + "/memory.stat");
      const uint64_t file =
          stat ? stat_value(*stat, "total_cache").value_or(stat_value(*stat, "cache").value_or(0)) : 0;
      consider(dir + "/memory.limit_in_bytes", *limit, *usage, file);
    }
  }
  return best;
}

std::optional<MemoryLimit> address_space_limit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const uint64_t vm = self_status_bytes("VmSize");
  const uint64_t limit = static_cast<uint64_t>(rl.rlim_cur);
  return MemoryLimit{"RLIMIT_AS (ulimit -v)", limit, vm, limit > vm ? limit - vm : 0, false};
}

std::optional<MemoryLimit> mem_available() {
  const auto info = read_text("/proc/meminfo");
  if (!info) return std::nullopt;
  const auto avail = parse_status_kb(*info, "MemAvailable");
  if (!avail) return std::nullopt;
  const uint64_t total = parse_status_kb(*info, "MemTotal").value_or(0);
  return MemoryLimit{"MemAvailable", total, total > *avail ? total - *avail : 0, *avail, true};
}

}  // namespace

std::optional<uint64_t> parse_cgroup_limit(const std::string& text) {
  std::string t;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  }
  if (t.empty() || t == "max") return std::nullopt;
  for (char c : t) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  try {
    return static_cast<uint64_t>(std::stoull(t));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<uint64_t> parse_status_kb(const std::string& status, const std::string& key) {
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size() || line[key.size()] != ':') continue;
    std::istringstream v(line.substr(key.size() + 1));
    uint64_t kb = 0;
    if (v >> kb) return kb * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

uint64_t self_status_bytes(const std::string& key) {
  const auto status = read_text("/proc/self/status");
  return status ? parse_status_kb(*status, key).value_or(0) : 0;
}

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::optional<uint64_t> HostMemory::available(int sharing) const {
  const MemoryLimit* t = tightest(sharing);
  if (!t) return std::nullopt;
  return t->shared ? t->available / static_cast<uint64_t>(std::max(1, sharing)) : t->available;
}

const MemoryLimit* HostMemory::tightest(int sharing) const {
  const MemoryLimit* best = nullptr;
  uint64_t best_v = 0;
  for (const auto& l : limits) {
    const uint64_t v = l.shared ? l.available / static_cast<uint64_t>(std::max(1, sharing)) : l.available;
    if (!best || v < best_v) {
      best = &l;
      best_v = v;
    }
  }
  return best;
}

HostMemory host_memory() {
  HostMemory m;
  if (auto l = cgroup_limit()) m.limits.push_back(*l);
  if (auto l = address_space_limit()) m.limits.push_back(*l);
  if (auto l = mem_available()) m.limits.push_back(*l);
  return m;
}

HostMemory device_memory(int cuda_index) {
  if (cuda_index < 0) return host_memory();
  // On a GPU the activations live on the device: its free memory is the
  // limit, plus what libtorch's caching allocator holds without using.
  HostMemory m;
#ifdef TPRUN_TORCH_HAS_CUDA
  try {
    auto* alloc = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    const auto idx = static_cast<c10::DeviceIndex>(cuda_index);
    const auto [free_b, total_b] = alloc->getMemoryInfo(idx);
    const auto stats = alloc->getDeviceStats(idx);
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t cached = stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current;
    const uint64_t avail = static_cast<uint64_t>(free_b) + static_cast<uint64_t>(std::max<int64_t>(0, cached));
    m.limits.push_back(MemoryLimit{fmt::format("cuda:{} free", cuda_index), static_cast<uint64_t>(total_b),
                                   static_cast<uint64_t>(total_b) - std::min<uint64_t>(avail, total_b), avail, false});
  } catch (const std::exception&) {
    // No allocator / no device: nothing known.
  }
#endif
  return m;
}

}  // namespace tprun
