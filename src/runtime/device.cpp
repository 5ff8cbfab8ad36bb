#include "runtime/device.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun {

DeviceChoice choose_device(const std::string& requested, int local_rank, int cuda_devices,
                           bool built_with_cuda) {
  DeviceChoice c;
  if (requested.empty()) {
    if (built_with_cuda && cuda_devices > 0) {
      if (local_rank >= cuda_devices) {
        throw ConfigError(fmt::format(
            "local rank {} has no GPU: this node shows {} CUDA device(s); start at most {} ranks "
            "per node, or pass --device cpu",
            local_rank, cuda_devices, cuda_devices));
      }
      c.device = fmt::format("cuda:{}", local_rank);
      c.cuda_index = local_rank;
      c.reason = fmt::format("local rank {} of {} visible GPU(s)", local_rank, cuda_devices);
      c.why = DeviceChoice::Why::GpuVisible;
    } else {
      c.device = "cpu";
      c.reason = built_with_cuda ? "no GPU visible" : "built without CUDA";
      c.why = built_with_cuda ? DeviceChoice::Why::NoGpuVisible : DeviceChoice::Why::BuiltWithoutCuda;
    }
    return c;
  }
  if (requested == "cpu") {
    c.reason = "--device cpu";
    return c;
  }
  int index = -1;
  if (requested == "cuda") {
    index = local_rank;
  } else if (requested.rfind("cuda:", 0) == 0) {
    const std::string num = requested.substr(5);
    char* end = nullptr;
    long v = std::strtol(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || v < 0 || v > 1024) {
      throw ConfigError(fmt::format("--device '{}' is not cpu, cuda or cuda:N", requested));
    }
    index = static_cast<int>(v);
  } else {
    throw ConfigError(fmt::format("--device '{}' is not cpu, cuda or cuda:N", requested));
  }
  if (!built_with_cuda) {
    throw ConfigError(fmt::format("--device {}: this tprun's libtorch has no CUDA", requested));
  }
  if (index >= cuda_devices) {
    throw ConfigError(fmt::format("--device {}: cuda:{} does not exist ({} CUDA device(s) visible)",
                                  requested, index, cuda_devices));
  }
  c.device = fmt::format("cuda:{}", index);
  c.cuda_index = index;
  c.reason = fmt::format("--device {}", requested);
  return c;
}

std::string device_mismatch_advice(const std::string& wanted, const DeviceChoice& got) {
  const bool on_cuda = got.cuda_index >= 0;
  if ((wanted == "cuda") == on_cuda) return "";
  if (wanted != "cuda") {
    return got.why == DeviceChoice::Why::Requested
               ? fmt::format("pass --device cpu instead of {}, or set parallel.device = \"cuda\"", got.reason)
               : std::string("pass --device cpu");
  }
  switch (got.why) {
    case DeviceChoice::Why::BuiltWithoutCuda:
      return "this tprun was built against a libtorch without CUDA: run a CUDA build (docs/gpu.md), or compute "
             "on the CPU (parallel.device = \"cpu\", or leave it out)";
    case DeviceChoice::Why::NoGpuVisible:
      return "this build has CUDA but no GPU is visible to this process (no device, no driver, or "
             "CUDA_VISIBLE_DEVICES hides them): run on a node with a GPU, or compute on the CPU "
             "(parallel.device = \"cpu\", or leave it out)";
    default:
      return fmt::format("drop {} (or pass --device cuda), or set parallel.device = \"cpu\"", got.reason);
  }
}

int cpu_threads_for_rank(int cpus_in_mask, int ranks_sharing_mask) {
  if (cpus_in_mask < 1) cpus_in_mask = 1;
  if (ranks_sharing_mask < 1) ranks_sharing_mask = 1;
  return std::max(1, cpus_in_mask / ranks_sharing_mask);
}

bool cuda_built() {
#ifdef TPRUN_TORCH_HAS_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
  try {
    if (!at::globalContext().hasCUDA()) return 0;
    return static_cast<int>(at::detail::getCUDAHooks().deviceCount());
  } catch (...) {
    return 0;
  }
}

void synchronize_device(const std::string& device) {
  const c10::Device dev(device);
  if (!dev.is_cuda()) return;
  auto& hooks = at::detail::getCUDAHooks();
  hooks.deviceSynchronize(dev.has_index() ? dev.index() : hooks.current_device());
}

int cpus_in_affinity_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string affinity_mask_string() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "all";
  std::string out;
  int start = -1;
  for (int i = 0; i <= CPU_SETSIZE; ++i) {
    bool on = i < CPU_SETSIZE && CPU_ISSET(i, &set);
    if (on && start < 0) start = i;
    if (!on && start >= 0) {
      if (!out.empty()) out += ",";
      out += start == i - 1 ? fmt::format("{}", start) : fmt::format("{}-{}", start, i - 1);
      start = -1;
    }
  }
  return out;
}

void set_torch_threads(int intra, int interop) {
  at::set_num_threads(std::max(1, intra));
  try {
    at::set_num_interop_threads(std::max(1, interop));
  } catch (const std::exception&) {
    // Already started: keeps its size. Harmless; inter-op work is rare here.
  }
}

}  // namespace tprun
