#include "parallel/parallel_linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <fmt/format.h>

#include "checkpoint/shard_loader.h"
#include "runtime/error.h"

namespace tprun::parallel {

using checkpoint::ShardStyle;

ParallelLinear ParallelLinear::load(checkpoint::ShardLoader& loader, const std::string& prefix,
                                    const checkpoint::ShardRequest& weight_request, bool has_bias,
                                    const checkpoint::ShardRequest& bias_request) {
  ParallelLinear l;
  l.name_ = prefix;
  l.style_ = weight_request.style;
  l.tp_rank_ = weight_request.tp_rank;
  l.tp_size_ = weight_request.tp_size;
  const bool row = l.style_ == ShardStyle::Rowwise || l.style_ == ShardStyle::RowwiseSplitInput ||
                   l.style_ == ShardStyle::PackedRowwise;
  if (row && has_bias && bias_request.style != ShardStyle::Replicated) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: the bias of a row-wise layer must be replicated (added once after the reduce)",
                            prefix));
  }
  l.weights_.weight = std::make_shared<at::Tensor>(loader.load(prefix + ".weight", weight_request));
  if (has_bias) l.weights_.bias = std::make_shared<at::Tensor>(loader.load(prefix + ".bias", bias_request));
  const int64_t k_local = l.weights_.weight->size(1);
  if (l.style_ == ShardStyle::PackedRowwise) {
    l.in_blocks_ = weight_request.blocks;  // absolute sizes of the full input dim (from the table)
  } else if (l.style_ == ShardStyle::RowwiseSplitInput) {
    l.in_blocks_ = {k_local * l.tp_size_};
  }
  return l;
}

bool ParallelLinear::partial_output() const {
  return style_ == ShardStyle::Rowwise || style_ == ShardStyle::RowwiseSplitInput ||
         style_ == ShardStyle::PackedRowwise;
}

at::Tensor ParallelLinear::slice_input(const at::Tensor& x) const {
  // The replicated input's last dim is [block_1 .. block_m]; this rank takes
  // [r b_j/p, (r+1) b_j/p) of every block, in block order (as the weight).
  const int64_t k = x.size(-1);
  int64_t total = 0;
  for (int64_t b : in_blocks_) total += b;
  if (total != k) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: input last dim {} does not match the layer's full input dim {}", name_, k, total));
  }
  std::vector<at::Tensor> parts;
  int64_t offset = 0;
  for (int64_t b : in_blocks_) {
    const int64_t piece = b / tp_size_;
    parts.push_back(x.narrow(-1, offset + tp_rank_ * piece, piece));
    offset += b;
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, -1);
}

at::Tensor ParallelLinear::forward(const at::Tensor& x) const {
  const at::Tensor& w = *weights_.weight;
  switch (style_) {
    case ShardStyle::Replicated:
    case ShardStyle::Colwise:
    case ShardStyle::PackedColwise:
      return weights_.bias ? at::linear(x, w, *weights_.bias) : at::linear(x, w);
    case ShardStyle::Rowwise:
      return at::linear(x, w);
    case ShardStyle::PackedRowwise:
      // Called with the concatenation of the blocks' local shards (already
      // this rank's slice); the blocks are only needed for split input.
      return at::linear(x, w);
    case ShardStyle::RowwiseSplitInput:
      return at::linear(slice_input(x), w);
  }
  return at::Tensor();
}

at::Tensor ParallelLinear::add_bias(const at::Tensor& reduced) const {
  if (!partial_output()) {
    throw Error(Error::Kind::Internal, fmt::format("{}: add_bias on a layer that already added its bias", name_));
  }
  return weights_.bias ? reduced + *weights_.bias : reduced;
}

}  // namespace tprun::parallel
