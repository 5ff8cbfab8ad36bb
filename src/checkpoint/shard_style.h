#pragma once
// How a tensor-parallel style splits a stored tensor and how a layer of that
// style computes: the single definition that slice plans, the shard loader
// (shard-on-load and load-then-shard), HDF5 hyperslab reads, model tables and
// the parallel layers all read.
//
// A stored Linear weight is [out, in] (row-major; conv kernels' trailing dims
// travel with dim 1):
//   style                 split dim  output of the layer       bias
//   replicated            none       whole                     whole
//   colwise               0          sharded (last dim)        split with dim 0
//   packed_colwise        0, per block  sharded per block      split per block
//   rowwise               1          partial sum -> AllReduce  whole, added once after the reduce
//   rowwise_split_input   1          partial sum -> AllReduce  whole, added once after the reduce
//                                    (the layer slices its replicated input first)
//   packed_rowwise        1, per block  partial sum -> AllReduce  whole, added once after the reduce

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tprun::checkpoint {

enum class ShardStyle { Replicated, Colwise, Rowwise, RowwiseSplitInput, PackedColwise, PackedRowwise };

// "colwise", "packed_rowwise", ...
const char* shard_style_name(ShardStyle style);

// The stored dimension the style splits: 0, 1, or -1 (replicated).
int split_dim(ShardStyle style);
// Packed styles split each block of the split dim on its own.
bool is_packed(ShardStyle style);
// A layer of this style produces a partial sum to AllReduce (the row-wise family).
bool output_is_partial(ShardStyle style);
// rowwise_split_input: the layer takes its slice of a replicated input itself.
bool slices_input(ShardStyle style);
// The style of a Linear's bias given its weight's: split along with the output
// features (colwise family), else whole (added once, after the reduce).
ShardStyle bias_style(ShardStyle weight_style);

// One rank's share of one tensor.
struct ShardRequest {
  ShardStyle style = ShardStyle::Replicated;
  int tp_rank = 0;
  int tp_size = 1;
  // Packed styles: block proportions ([1,1], [1,1,1,3,3]) or, with
  // blocks_absolute, sizes along the split dim that sum to it.
  std::vector<int64_t> blocks;
  bool blocks_absolute = false;
  // True when the request keeps the whole tensor (replicated or tp 1).
  bool whole() const { return style == ShardStyle::Replicated || tp_size == 1; }
};

// Block sizes along `dim_size` for a packed request (validated: positive,
// summing to the dim or dividing it in the given proportions).
std::vector<int64_t> packed_block_sizes(const std::string& tensor, int64_t dim_size, const ShardRequest& request);

// Where this rank's slice lies along the split dim: one [start, count) span
// per block (one block unless packed), in block order; the slice is their
// concatenation. `dim` is -1 and `spans` empty for a whole tensor.
// CheckpointError naming tensor, dim, block and tp when a block does not
// divide by tp, the rank is out of range, or the tensor has too few dims.
struct SplitSpans {
  int dim = -1;
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<int64_t> slice_shape;  // the shape of this rank's slice
};
SplitSpans split_spans(const std::string& tensor, const std::vector<int64_t>& shape, const ShardRequest& request);

}  // namespace tprun::checkpoint
