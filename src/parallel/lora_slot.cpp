#include "parallel/lora_slot.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/linear.h>


namespace tprun::parallel {

void add_lora_terms(at::Tensor& y, const at::Tensor& x, const LoraSlot& slot) {
  for (const LoraDelta& d : slot.deltas) {
    // (x A^T) first: r is small, so the two matmuls cost 2 r (K + N) per row
    // instead of the K N a merged weight would.
    const at::Tensor low = at::linear(x, d.down);
    y.add_(at::linear(low, d.up), d.scale);
  }
}

}  // namespace tprun::parallel
