#pragma once
// Which bytes of a stored tensor one TP rank needs (pure arithmetic, no I/O).
//
// A stored tensor is row-major: dim 0 = output features ("rows"), dim 1 =
// input features; trailing dims (conv kernels) travel with dim 1.
//   replicated        the whole tensor                     1 range
//   colwise           rows [r*R/tp, (r+1)*R/tp)            1 contiguous range
//   rowwise           columns [r*C/tp, ...) of every row    1 range per row
//   (rowwise_split_input is stored and sliced like rowwise)
//   packed_colwise    each row block split on its own       1 range per block
//   packed_rowwise    each column block split on its own    1 range per row per block
// Adjacent ranges are merged. A size that does not divide is an error naming
// tensor, dimension, size and tp.

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/shard_style.h"

namespace tprun::checkpoint {

struct ByteRange {
  uint64_t src = 0;  // offset within the stored tensor's bytes
  uint64_t dst = 0;  // offset within this rank's slice
  uint64_t len = 0;
};

struct SlicePlan {
  std::vector<int64_t> shape;    // this rank's slice
  std::vector<ByteRange> ranges;  // sorted by src and by dst
  uint64_t bytes = 0;             // total bytes of the slice
};

// `elem_bits` is the stored dtype's width (sub-byte types cannot be split).
SlicePlan plan_slice(const std::string& tensor, const std::vector<int64_t>& shape, int elem_bits,
                     const ShardRequest& request);

}  // namespace tprun::checkpoint
