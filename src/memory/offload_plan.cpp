#include "memory/offload_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::memory {
namespace fs = std::filesystem;

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string stat_line(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return fmt::format("{}: missing", p.filename().string());
  const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return fmt::format("{} {} {}", p.filename().string(), static_cast<int64_t>(st.st_size), ns);
}

}  // namespace

std::string offload_group_of(const std::string& tensor, const std::string& type, int64_t blocks_per_group) {
  if (type == "model_level") return "model";
  if (type == "leaf_level") {
    const size_t dot = tensor.rfind('.');
    return dot == std::string::npos ? std::string("top_level") : tensor.substr(0, dot);
  }
  // block_level: the first numbered component.
  size_t start = 0;
  while (start < tensor.size()) {
    const size_t dot = tensor.find('.', start);
    const std::string part = tensor.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (start > 0 && all_digits(part)) {
      const std::string list = tensor.substr(0, start - 1);
      const int64_t index = std::stoll(part);
      const int64_t n = std::max<int64_t>(1, blocks_per_group);
      const int64_t first = index / n * n;
      return n == 1 ? fmt::format("{}.{}", list, index) : fmt::format("{}.{}-{}", list, first, first + n - 1);
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return "top_level";
}

int accelerator_index(const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return -1;
  return device.size() > 5 ? std::stoi(device.substr(5)) : 0;
}

void refuse_device_map_with_tp(const MemoryOptions& memory, int tp_size) {
  if (!memory.device_mapped() || tp_size <= 1) return;
  throw ConfigError(fmt::format("memory.device_map cannot be combined with tensor parallelism (tp = {}, "
                                "parallel.tp / --tp): TP splits the modules a device map would place; use "
                                "memory.offload, which composes with TP, or tp = 1",
                                tp_size),
                    true);
}

bool module_encloses(const std::string& prefix, const std::string& tensor) {
  if (prefix.empty()) return true;
  return tensor.size() > prefix.size() && tensor.compare(0, prefix.size(), prefix) == 0 && tensor[prefix.size()] == '.';
}

ComponentPlacement place_tensors(const std::vector<std::string>& names, const MemoryOptions& memory,
                                 const std::string& device, const std::string& component) {
  const int own_index = accelerator_index(device);
  const bool on_accelerator = own_index >= 0;
  ComponentPlacement out;
  out.tensors.resize(names.size());

  // Device-map entries first: each must enclose a tensor of this component.
  std::vector<const DevicePlacement*> entries;
  for (const auto& e : memory.device_map) {
    const std::string key = fmt::format("memory.device_map.\"{}\"", component.empty() ? e.first
                                                                                        : (e.first.empty() ? component : component + "." + e.first));
    const auto target = device_map_target(e.second);
    if (!target) throw ConfigError(fmt::format("{}: '{}' is not a device", key, e.second), true);
    if (*target >= 0 && *target != own_index) {
      throw ConfigError(
          fmt::format("{}: device {} is not this rank's ({}): tprun runs one rank per accelerator and each "
                      "component on its rank's device; place weights there, on \"cpu\" or on \"disk\"",
                      key, e.second, device),
          true);
    }
    const bool any = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return module_encloses(e.first, n);
    });
    if (!any) {
      throw ConfigError(fmt::format("{}: names no module of {} (its tensors are named like '{}')", key,
                                    component.empty() ? std::string("this model") : component,
                                    names.empty() ? std::string() : names.front()),
                        true);
    }
    entries.push_back(&e);
  }

  const OffloadOptions& off = memory.offload;
  const std::string type = off.enabled() ? off.type : std::string("block_level");
  const int64_t per_group = off.enabled() ? off.blocks_per_group : 1;
  for (size_t i = 0; i < names.size(); ++i) {
    const DevicePlacement* best = nullptr;
    for (const auto* e : entries)
      if (module_encloses(e->first, names[i]) && (!best || e->first.size() > best->first.size())) best = e;
    Tier tier = Tier::Resident;
    if (best) {
      const int target = *device_map_target(best->second);
      tier = target == -2 ? Tier::Disk : (target == -1 && on_accelerator ? Tier::Host : Tier::Resident);
    } else if (off.enabled()) {
      if (off.to == "disk") {
        tier = Tier::Disk;
      } else if (on_accelerator) {
        tier = Tier::Host;
      } else {
        out.offload_noop = true;
      }
    }
    out.tensors[i].tier = tier;
    if (tier != Tier::Resident) {
      // A group never mixes tiers (a device map may place part of one).
      out.tensors[i].group = fmt::format("{}{}", tier == Tier::Disk ? "" : "host:",
                                         offload_group_of(names[i], type, per_group));
    }
  }
  return out;
}

std::string stable_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

std::string checkpoint_stamp(const std::string& path) {
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(fs::path(path), ec);
  std::string stamp = (ec ? fs::path(path) : real).string();
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> lines;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec)) lines.push_back(stat_line(entry.path()));
      if (lines.size() > 100000) break;
    }
    std::sort(lines.begin(), lines.end());
    for (const auto& l : lines) stamp += "\n" + l;
  } else {
    stamp += "\n" + stat_line(fs::path(path));
  }
  return stamp;
}

std::string disk_group_folder(const std::string& root, const std::string& source_path, const std::string& settings,
                              int tp_rank, int tp_size) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(fs::path(source_path), ec);
  if (ec) real = fs::path(source_path);
  std::string name = real.filename().string();
  if (name.empty()) name = "component";
  const std::string key = fmt::format("{}:{}\n{}", real.string().size(), real.string(), settings);
  return (fs::path(root) / fmt::format("{}-{}", name, stable_hash(key)) /
          fmt::format("tp{}of{}", tp_rank, tp_size))
      .string();
}

std::string disk_group_file(const std::string& group) {
  std::string f;
  for (char c : group) f += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  if (f.size() > 200) f = f.substr(0, 180) + "-" + stable_hash(group);
  return f + ".safetensors";
}

void check_writable_folder(const std::string& folder, const std::string& key) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  const auto full = [](int err) { return err == ENOSPC || err == EDQUOT; };
  if (ec) {
    if (full(ec.value())) throw_io_error(fmt::format("{}: cannot create the folder", key), folder, ec.value());
    throw ConfigError(fmt::format("{}: cannot create {}: {}", key, folder, ec.message()), true);
  }
  // A fresh name (mkstemp: O_CREAT | O_EXCL), so a symlink planted at a predictable probe name is never followed.
  std::string probe = (fs::path(folder) / ".tprun-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    const int err = errno;
    if (full(err)) throw_io_error(fmt::format("{}: cannot write in the folder", key), folder, err);
    throw ConfigError(fmt::format("{}: {} is not writable: {}", key, folder, std::strerror(err)), true);
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace tprun::memory
