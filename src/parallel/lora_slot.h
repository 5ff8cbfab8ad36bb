#pragma once
// The low-rank adapters one ParallelLinear runs with at the moment (run-time
// LoRA, as PEFT's LoraLayer: y = x W^T + b + sum_i scale_i (x A_i^T) B_i^T),
// held as this rank's part of each adapter:
//   colwise family   A whole [r, K], B this rank's rows [N_local, r] (per
//                    block for packed colwise, as the base weight's rows)
//   row-wise family  A this rank's columns [r, K_local] (per block when
//                    packed), B whole [N, r]; the term is part of the partial
//                    sum the layer reduces, so no extra communication
//   replicated       A and B whole
// The slot is shared by every copy of its layer (layers are values); the
// adapter set in force (lora/adapter_set.h) fills and clears it. Included
// only by .cpp files: it brings ATen.

#include <vector>

#include <ATen/core/Tensor.h>

namespace tprun::parallel {

struct LoraDelta {
  at::Tensor down;  // A: [r, K or K_local], compute dtype, compute device
  at::Tensor up;    // B: [N_local or N, r]
  double scale = 1.0;  // the adapter's weight x alpha / r
};

struct LoraSlot {
  std::vector<LoraDelta> deltas;  // summed in order; empty: the base layer alone
};

// sum_i scale_i (x A_i^T) B_i^T added to `y` in place (y's last dim is the
// layer's output on this rank: N_local or N).
void add_lora_terms(at::Tensor& y, const at::Tensor& x, const LoraSlot& slot);

}  // namespace tprun::parallel
