#pragma once
// Moves offloaded weight groups (memory/offload_plan.h) between their storage
// tier and the compute device, as diffusers' group-offloading hooks do, but
// driven by the weights themselves: the first use of a weight whose group is
// not on the device brings that group in (reading its file for the disk
// tier), and every other group goes back, so the device / host holds the
// group in use plus, with prefetch, the one expected next (the group that
// followed this one last time; a reader thread on CPU, a side CUDA stream
// with pinned host buffers on an accelerator). One offloader per process:
// every component's groups take turns.
//
// A group's tensors are handed out as tensors; a caller still holding one
// keeps its memory alive after the group went back, so a mispredicted or
// early release costs time, never correctness.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/offload_plan.h"

namespace at {
class Tensor;
}

namespace tprun::memory {

struct GroupSpec {
  std::string label;   // "FluxTransformer2DModel transformer_blocks.0", for messages
  Tier tier = Tier::Disk;
  std::string device;  // compute device: "cpu" | "cuda:N"
  bool prefetch = false;
  std::vector<std::string> names;  // its tensors, in the order indices refer to
  // Disk: the group's file and what its metadata must say it holds (its
  // bytes must also match the XXH3 hash recorded when it was written).
  std::string file;
  std::string fingerprint;
};

struct OffloadStats {
  int64_t groups = 0;          // registered
  int64_t loads = 0;           // groups brought to the device
  int64_t prefetch_hits = 0;   // of them, already read ahead
  uint64_t bytes_moved = 0;    // bytes read from disk / copied from host
  // Most weight bytes of groups on the device at once (the group in use plus
  // the one being read ahead): what offload leaves resident at its peak.
  uint64_t max_bytes_in_flight = 0;
  double wait_s = 0;           // compute time spent waiting for a group
  int64_t files_written = 0;   // disk groups written by loads of this process
  int64_t files_reused = 0;    // disk groups found valid and reused
  int64_t files_rewritten = 0; // of the written, files that held other weights or stale bytes
  // Disk groups this process loaded but found written meanwhile by another
  // run sharing the folder (each group file has one writer).
  int64_t files_shared = 0;
};

class GroupOffloader {
 public:
  static GroupOffloader& instance();
  ~GroupOffloader();

  // Registers a group; for the disk tier, checks whether its file already
  // holds exactly `fingerprint` with intact bytes (read once to check the
  // hash; reusable(): its tensors need not be read from the checkpoint).
  int add_group(GroupSpec spec);
  bool reusable(int group) const;
  // Loading: tensor `index` of the group as loaded (any device). Host: kept
  // in host memory (pinned for an accelerator). Disk: kept until the group's
  // last tensor arrives, then the group's file is written (atomically,
  // replacing a stale one; under a per-file lock, skipped when another run
  // sharing the folder wrote it meanwhile) and the tensors dropped. IoError
  // (exit 7) when the file cannot be written (a full disk). Not for reusable
  // groups.
  void put(int group, size_t index, const at::Tensor& tensor);
  // Internal error naming the groups that did not receive all their tensors.
  void check_complete(const std::vector<int>& groups) const;

  // The tensor on the compute device, bringing its group in if needed. A
  // disk group's bytes are checked against its hash as they are read: IoError
  // naming the file when it changed since the load (not rewritable here; the
  // next run's load rewrites it).
  at::Tensor get(int group, size_t index);
  uint64_t group_bytes(int group) const;
  OffloadStats stats() const;

 private:
  GroupOffloader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tprun::memory
