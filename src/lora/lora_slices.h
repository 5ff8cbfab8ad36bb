#pragma once
// One rank's part of an adapter file, read as the base weights are
// (shard-on-load): for each adapted module, the tensor its TP style splits is
// read as this rank's slice, the other whole (parallel/lora_slot.h has the
// table), straight from the file's bytes; kohya's fused modules read their
// rows of the shared up tensor. Values are checked finite, agreed over the TP
// group, so a NaN in any rank's slice stops every rank with one message.
// Included by lora/ .cpp files only: it brings ATen.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "lora/lora_layout.h"
#include "models/model.h"

namespace tprun::lora {

struct LoraModuleSlice {
  std::string module;
  at::Tensor down, up;      // this rank's A and B, in the layer's dtype, on its device
  double alpha_scale = 1.0;  // the part's alpha / r
};

struct LoraComponentSlices {
  std::string component;
  std::vector<LoraModuleSlice> modules;
};

struct LoraFileSlices {
  std::string path;
  std::vector<LoraComponentSlices> components;
  uint64_t bytes_read = 0;      // from the file, this rank
  uint64_t bytes_resident = 0;  // kept, this rank
};

// A component a layout's parts land on: its name and the loaded model.
struct LoraModel {
  std::string component;
  const models::Model* model = nullptr;
};

// Reads this rank's slices of `layout` for `models` (each layout component
// must be among them, each part's module a loaded Linear of it).
// CheckpointError naming the file and key for a value that is not finite
// (raised on every rank of the TP group alike) or a read that fails.
LoraFileSlices read_lora_slices(const LoraLayout& layout, const std::vector<LoraModel>& models);

// The bytes this rank keeps of one part at TP (rank, size) for a layer kept
// in `element_bytes`-wide values: what the memory planner counts.
uint64_t lora_part_bytes(const LoraModulePart& part, const models::ModelTable& table, int tp_size,
                         int element_bytes);

}  // namespace tprun::lora
