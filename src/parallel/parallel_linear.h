#pragma once
// A Linear layer split across a tensor-parallel group (Megatron-LM's
// ColumnParallelLinear / RowParallelLinear; vLLM's RowParallelLinear with
// reduce_results=True). Every forward returns a finished output: row-wise
// layers reduce over the group and add their bias once, inside the layer.
//
// A Linear computes Y = X A^T + b with A of shape [N, K] (out, in). With p
// ranks (checkpoint/shard_style.h has the table of styles):
//   colwise      A = [A_1; ..; A_p] split along N (rows), b = [b_1 .. b_p].
//                Rank r computes Y_r = X A_r^T + b_r; the output stays sharded
//                along its last dim (for attention: a contiguous range of heads).
//   packed colwise  N is the concatenation of blocks [N_1 .. N_m] (q|k|v|gate|up),
//                each split on its own: rank r's output is [Y_1,r .. Y_m,r].
//   rowwise      A = [A_1 .. A_p] split along K (columns); X arrives sharded
//                along its last dim as X = [X_1 .. X_p] (the output of a
//                colwise layer). Y = AllReduce_r(X_r A_r^T) + b.
//   packed rowwise  K is the concatenation of blocks [K_1 .. K_m], each split
//                on its own: rank r holds columns [r K_j/p, (r+1) K_j/p) of every
//                block j, in block order; its input is the concatenation of the
//                blocks' local shards, in the same order.
//   rowwise_split_input  like rowwise, but X is replicated: the layer first
//                takes its slice of X's last dim (per block when packed).
//   replicated   the whole A and b on every rank: Y = X A^T + b.
//
// One AllReduce per row-wise forward; rowwise_forward closes several row-wise
// layers (the two streams of a block, many modulations) with ONE AllReduce.
// Storage is the Weight's (parallel/weight.h): the layer computes with
// whatever its weights hand back.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/shard_style.h"
#include "parallel/tp_context.h"
#include "parallel/weight.h"

namespace at {
class Tensor;
}

namespace tprun::parallel {

struct RowwiseBatch;
struct LoraSlot;

class ParallelLinear {
 public:
  ParallelLinear() = default;
  // `weight`: this rank's slice [N_local, K_local]; `bias` (may be undefined):
  // this rank's slice for the colwise family, whole for the row-wise family.
  // `in_blocks`: for packed rowwise and rowwise_split_input, the block sizes
  // of the FULL input dim (one block when not packed). Internal error when
  // tp.size > 1 comes without a communicator.
  ParallelLinear(std::string name, checkpoint::ShardStyle style, std::vector<int64_t> in_blocks, const TpContext& tp,
                 Weight weight, Weight bias);

  // The layer's output for this rank: replicated / colwise family X W^T + b
  // (colwise: this rank's shard); row-wise family: the partial sums reduced
  // over the TP group plus b, the same full output on every rank.
  at::Tensor forward(const at::Tensor& x) const;

  // False for a layer that was declared but not loaded.
  bool defined() const { return weight_.defined(); }
  checkpoint::ShardStyle style() const { return style_; }
  const std::string& name() const { return name_; }
  const Weight& weight() const { return weight_; }
  const Weight& bias() const { return bias_; }
  const TpContext& tp() const { return tp_; }
  // Run-time LoRA (parallel/lora_slot.h): the slot this layer and its copies
  // read at every forward; null: no adapter can be attached.
  void attach_lora_slot(std::shared_ptr<LoraSlot> slot) { lora_ = std::move(slot); }
  const std::shared_ptr<LoraSlot>& lora_slot() const { return lora_; }

 private:
  friend std::vector<at::Tensor> rowwise_forward(const RowwiseBatch& batch);
  at::Tensor partial(const at::Tensor& x) const;          // row-wise: X_r A_r^T, no bias, no reduce
  at::Tensor add_bias(const at::Tensor& reduced) const;  // row-wise: + b once
  at::Tensor slice_input(const at::Tensor& x) const;

  std::string name_;
  checkpoint::ShardStyle style_ = checkpoint::ShardStyle::Replicated;
  TpContext tp_;
  std::vector<int64_t> in_blocks_;
  Weight weight_, bias_;
  std::shared_ptr<LoraSlot> lora_;
};

// Several row-wise layers (each with its input) closed by one AllReduce: the
// partial sums are flattened into one buffer, reduced, split back, and each
// layer adds its bias. All layers must belong to one TP group; outputs come
// back in order. At tp 1: plain forwards, no communication. Internal error
// for a layer that is not row-wise.
struct RowwiseCall {
  const ParallelLinear* layer;
  const at::Tensor* input;
};
struct RowwiseBatch {
  std::vector<RowwiseCall> calls;
  RowwiseBatch& add(const ParallelLinear& layer, const at::Tensor& input) {
    calls.push_back({&layer, &input});
    return *this;
  }
};
std::vector<at::Tensor> rowwise_forward(const RowwiseBatch& batch);

// Sums tensors over the TP group with ONE all_reduce (flattened and
// concatenated); returns them reduced, in order. No call when tp.size == 1.
std::vector<at::Tensor> all_reduce_coalesced(const TpContext& tp, const std::vector<at::Tensor>& partials);

}  // namespace tprun::parallel
