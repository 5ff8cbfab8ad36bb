#pragma once
// A Linear layer split across a tensor-parallel group (Megatron-LM's
// ColumnParallelLinear / RowParallelLinear, with the communication left to the
// caller so that one AllReduce can close several layers at a block boundary).
//
// A Linear computes Y = X A^T + b with A of shape [N, K] (out, in). With p
// ranks:
//   colwise      A = [A_1; ..; A_p] split along N (rows), b = [b_1 .. b_p].
//                Rank r computes Y_r = X A_r^T + b_r; the output stays sharded
//                along its last dim (for attention: a contiguous range of heads).
//   rowwise      A = [A_1 .. A_p] split along K (columns); X arrives sharded
//                along its last dim as X = [X_1 .. X_p] (the output of a
//                colwise layer). Rank r computes the partial sum
//                P_r = X_r A_r^T, WITHOUT bias; Y = sum_r P_r + b. The caller
//                AllReduces the partials (one call may carry several layers'
//                partials) and then adds the bias once (add_bias).
//   packed rowwise  K is the concatenation of blocks [K_1 .. K_m], each split
//                on its own: rank r holds columns [r K_j/p, (r+1) K_j/p) of every
//                block j, in block order. Its input is the concatenation of the
//                blocks' local shards, in the same order.
//   rowwise_split_input  like rowwise, but X is replicated: the layer first
//                takes its slice of X's last dim (per block when packed), then
//                computes the partial sum as above.
//   replicated   the whole A and b on every rank: Y = X A^T + b.
//
// Storage (LinearWeights) is kept apart from compute (ParallelLinear::forward)
// so that another storage (fp8 with per-layer upcast) can slot in later.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/slice_plan.h"
#include "parallel/tp_context.h"

namespace at {
class Tensor;
}

namespace tprun::checkpoint {
class ShardLoader;
}

namespace tprun::parallel {

// This rank's slices of one Linear, in the compute dtype, on the device.
// (shared_ptr: the header only forward-declares at::Tensor.)
struct LinearWeights {
  std::shared_ptr<at::Tensor> weight;  // [N_local, K_local]
  std::shared_ptr<at::Tensor> bias;    // null when the layer has none
};

class ParallelLinear {
 public:
  ParallelLinear() = default;

  // Loads `<prefix>.weight` (and `<prefix>.bias` when has_bias) through the
  // loader, which reads only this rank's slice. The weight request's style
  // decides how the layer computes (ShardStyle::PackedColwise is stored like
  // colwise blocks and computed like colwise). A rowwise layer's bias must be
  // requested Replicated.
  static ParallelLinear load(checkpoint::ShardLoader& loader, const std::string& prefix,
                             const checkpoint::ShardRequest& weight_request, bool has_bias,
                             const checkpoint::ShardRequest& bias_request);

  // Colwise / replicated: X W^T + b. Row-wise styles: the partial sum (no bias).
  at::Tensor forward(const at::Tensor& x) const;
  // True for the styles whose output is a partial sum to AllReduce.
  bool partial_output() const;
  // Adds the (replicated) bias to the reduced output of a row-wise layer.
  at::Tensor add_bias(const at::Tensor& reduced) const;

  checkpoint::ShardStyle style() const { return style_; }
  const LinearWeights& weights() const { return weights_; }
  const std::string& name() const { return name_; }

 private:
  at::Tensor slice_input(const at::Tensor& x) const;
  std::string name_;
  checkpoint::ShardStyle style_ = checkpoint::ShardStyle::Replicated;
  int tp_rank_ = 0, tp_size_ = 1;
  std::vector<int64_t> in_blocks_;  // packed / split-input: block sizes of the FULL input dim
  LinearWeights weights_;
};

}  // namespace tprun::parallel
