#pragma once
// Where each of a component's weights lives under the [memory] offload and
// device_map settings, decided from names alone before any weight byte is
// read (torch-free): a tier per tensor and the group it comes to the compute
// device with (memory/group_offloader.h moves the groups).

#include <cstdint>
#include <string>
#include <vector>

#include "memory/memory_options.h"

namespace tprun::memory {

// Resident: on the compute device for the whole run. Host: in host memory,
// copied to the accelerator per use (only on an accelerator rank: on a CPU
// rank the host is the compute device). Disk: in a file, read per use.
enum class Tier { Resident, Host, Disk };

// The group of `tensor` under an offload type (diffusers' names):
//   block_level  the first numbered component of the name is a block list's
//                index ("transformer_blocks.3.attn.to_q.weight"); blocks
//                are chunked into groups of blocks_per_group per list
//                ("transformer_blocks.2-3"); a name with no number goes to
//                "top_level".
//   leaf_level   one group per layer: the name without its last component.
//   model_level  one group: "model".
std::string offload_group_of(const std::string& tensor, const std::string& type, int64_t blocks_per_group);

// The accelerator index of a compute device: N for "cuda:N" (0 for "cuda"),
// -1 for the host.
int accelerator_index(const std::string& device);

// ConfigError naming memory.device_map and the TP size when a device map is
// set with tp > 1 (TP splits the modules a map would place).
void refuse_device_map_with_tp(const MemoryOptions& memory, int tp_size);

// Whether the module path `prefix` ("" = everything) encloses `tensor`.
bool module_encloses(const std::string& prefix, const std::string& tensor);

struct TensorPlacement {
  Tier tier = Tier::Resident;
  std::string group;  // "" for Resident
};

struct ComponentPlacement {
  std::vector<TensorPlacement> tensors;  // one per name given
  bool offload_noop = false;             // offload to = "cpu" on a CPU rank: nothing to do
};

// The placement of `names` (one component's wanted tensors, in load order)
// on a rank computing on `device` ("cpu" | "cuda:N"). `memory.device_map`
// holds component-relative entries here (the pipeline has resolved and
// stripped the component names); the longest enclosing entry wins, other
// tensors follow `memory.offload`. ConfigError naming memory.device_map.<entry>
// for an entry that encloses no tensor or names an accelerator that is not
// this rank's.
ComponentPlacement place_tensors(const std::vector<std::string>& names, const MemoryOptions& memory,
                                 const std::string& device, const std::string& component);

// FNV-1a 64 of `text`, as 16 hex digits: stable across runs and machines.
std::string stable_hash(const std::string& text);

// What identifies a checkpoint's bytes without reading them: the real path
// and, for every file of the folder (or the file), its name, size and
// modification time in nanoseconds.
std::string checkpoint_stamp(const std::string& path);

// The folder a component's disk groups live in on one TP rank:
// <root>/<component folder name>-<hash>/tp<rank>of<size>, the hash over the
// component's real path and `settings`: every setting that changes the
// stored bytes (class, TP layout, dtype, fp8 storage and skip list, the
// groups and their tensors), so runs that differ in any of them never share
// (and overwrite) files, while runs that agree share them.
std::string disk_group_folder(const std::string& root, const std::string& source_path, const std::string& settings,
                              int tp_rank, int tp_size);

// A group name as a file name ("transformer_blocks.0" -> "transformer_blocks.0.safetensors").
std::string disk_group_file(const std::string& group);

// Creates `folder` (and parents) and checks a file can be written in it;
// ConfigError naming `key` and the errno text otherwise (IoError for a full
// disk or quota: nothing in the settings is wrong).
void check_writable_folder(const std::string& folder, const std::string& key);

}  // namespace tprun::memory
