#pragma once
// Which device a rank computes on, and how many CPU threads it may use.

#include <string>

namespace tprun {

struct DeviceChoice {
  // Why this device: --device asked for it, or the automatic choice found a GPU, found none, or this
  // build has no CUDA (what to tell a user who wanted the other device).
  enum class Why { Requested, GpuVisible, NoGpuVisible, BuiltWithoutCuda };
  std::string device = "cpu";  // "cpu" or "cuda:N"
  int cuda_index = -1;         // N for cuda:N
  std::string reason;          // why, for the log
  Why why = Why::Requested;
};

// requested: "" (automatic), "cpu", "cuda" (cuda:<local_rank>) or "cuda:N".
// Automatic: cuda:<local_rank> when this build has CUDA and a GPU is visible,
// else cpu. ConfigError naming --device for impossible requests.
DeviceChoice choose_device(const std::string& requested, int local_rank, int cuda_devices,
                           bool cuda_built);

// What is wrong, and what to do, when `wanted` ("cpu" or "cuda", e.g. a manifest's parallel.device)
// is not the device `got` computes on: no GPU visible, a build without CUDA, or --device asking for
// the other one. "" when they agree.
std::string device_mismatch_advice(const std::string& wanted, const DeviceChoice& got);

// Threads for a CPU rank: the CPUs it may run on, shared fairly with the other
// ranks of this node that may run on the same CPUs; at least 1.
int cpu_threads_for_rank(int cpus_in_mask, int ranks_sharing_mask);

// CUDA devices visible to this process (0 in a build without CUDA or without a GPU).
int cuda_device_count();
bool cuda_built();

// Waits until every kernel and copy queued on device `device` ("cpu", "cuda",
// "cuda:N") has finished; nothing on CPU. Timers of device work call it before
// reading the clock: CUDA work is asynchronous.
void synchronize_device(const std::string& device);

// This process's CPU affinity: the number of CPUs and a canonical string of
// them ("0-1"), used to find ranks that share CPUs.
int cpus_in_affinity_mask();
std::string affinity_mask_string();

// at::set_num_threads / at::set_num_interop_threads (the latter only before
// any inter-op work; later calls keep the first value).
void set_torch_threads(int intra, int interop);

}  // namespace tprun
