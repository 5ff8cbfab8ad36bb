#pragma once
// The Linear layers of a loaded model an adapter may reach (lora/): each
// loaded ParallelLinear by its module name ("transformer_blocks.0.attn.to_q"),
// with the slot its forwards read (parallel/lora_slot.h) and its weight (for
// fusing). What each layer is (shape, style, packed blocks, kept dtype) is
// the model table's entry for "<module>.weight". Filled by ModelBuilder as
// the layers load; a layer the load left out is not here.

#include <map>
#include <memory>
#include <string>

#include "parallel/tp_context.h"
#include "parallel/weight.h"

namespace tprun::parallel {
struct LoraSlot;
}

namespace tprun::models {

struct LoraTarget {
  std::shared_ptr<parallel::LoraSlot> slot;
  parallel::Weight weight;  // this rank's slice, as the layer computes with it
};

struct LoraTargets {
  std::map<std::string, LoraTarget> modules;
  parallel::TpContext tp;
  std::string device = "cpu";  // the compute device and dtype of the load
  std::string dtype = "fp32";
};

}  // namespace tprun::models
