#include "checkpoint/slice_plan.h"

#include <numeric>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::checkpoint {
namespace {

void add_range(SlicePlan& p, uint64_t src, uint64_t len) {
  if (len == 0) return;
  if (!p.ranges.empty()) {
    ByteRange& last = p.ranges.back();
    if (last.src + last.len == src) {  // contiguous in the file and in the slice
      last.len += len;
      p.bytes += len;
      return;
    }
  }
  p.ranges.push_back({src, p.bytes, len});
  p.bytes += len;
}

void require_divisible(const std::string& tensor, int dim, int64_t size, int tp, const std::string& what = "") {
  if (size % tp != 0) {
    throw CheckpointError(fmt::format("tensor '{}': dim {}{} (size {}) is not divisible by tp {}", tensor,
                                      dim, what, size, tp));
  }
}

}  // namespace

const char* shard_style_name(ShardStyle s) {
  switch (s) {
    case ShardStyle::Replicated: return "replicated";
    case ShardStyle::Colwise: return "colwise";
    case ShardStyle::Rowwise: return "rowwise";
    case ShardStyle::RowwiseSplitInput: return "rowwise_split_input";
    case ShardStyle::PackedColwise: return "packed_colwise";
    case ShardStyle::PackedRowwise: return "packed_rowwise";
  }
  return "?";
}

std::vector<int64_t> packed_block_sizes(const std::string& tensor, int64_t dim_size,
                                        const ShardRequest& r) {
  if (r.blocks.empty()) {
    throw CheckpointError(fmt::format("tensor '{}': {} needs block sizes", tensor, shard_style_name(r.style)));
  }
  for (auto b : r.blocks) {
    if (b <= 0) throw CheckpointError(fmt::format("tensor '{}': block sizes must be positive", tensor));
  }
  const int64_t total = std::accumulate(r.blocks.begin(), r.blocks.end(), int64_t{0});
  std::vector<int64_t> sizes;
  if (r.blocks_absolute) {
    if (total != dim_size) {
      throw CheckpointError(fmt::format("tensor '{}': packed blocks [{}] sum to {}, but the split dim has {}",
                                        tensor, fmt::join(r.blocks, ", "), total, dim_size));
    }
    sizes = r.blocks;
  } else {
    if (dim_size % total != 0) {
      throw CheckpointError(fmt::format("tensor '{}': split dim of size {} cannot be cut in proportions [{}]",
                                        tensor, dim_size, fmt::join(r.blocks, ", ")));
    }
    for (auto b : r.blocks) sizes.push_back(dim_size / total * b);
  }
  return sizes;
}

SlicePlan plan_slice(const std::string& tensor, const std::vector<int64_t>& shape, int elem_bits,
                     const ShardRequest& r) {
  SlicePlan p;
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  if (r.style == ShardStyle::Replicated || r.tp_size == 1) {
    p.shape = shape;
    add_range(p, 0, static_cast<uint64_t>(numel) * elem_bits / 8);
    if (p.ranges.empty()) p.bytes = 0;
    return p;
  }
  if (r.tp_size < 1 || r.tp_rank < 0 || r.tp_rank >= r.tp_size) {
    throw CheckpointError(fmt::format("tensor '{}': tp rank {} of {} is out of range", tensor, r.tp_rank, r.tp_size));
  }
  if (elem_bits % 8 != 0) {
    throw CheckpointError(fmt::format("tensor '{}': a {}-bit dtype cannot be split for tensor parallelism",
                                      tensor, elem_bits));
  }
  const uint64_t elem = static_cast<uint64_t>(elem_bits / 8);
  const int tp = r.tp_size, k = r.tp_rank;
  const bool col = r.style == ShardStyle::Colwise || r.style == ShardStyle::PackedColwise;
  if (shape.empty() || (!col && shape.size() < 2)) {
    throw CheckpointError(fmt::format("tensor '{}' of shape [{}] cannot be split {}", tensor,
                                      fmt::join(shape, ", "), shard_style_name(r.style)));
  }
  const int64_t rows = shape[0];
  int64_t row_elems = 1;  // elements per row (all dims after 0)
  for (size_t i = 1; i < shape.size(); ++i) row_elems *= shape[i];
  p.shape = shape;

  if (col) {
    // Blocks of rows; each split on its own.
    std::vector<int64_t> blocks{rows};
    if (r.style == ShardStyle::PackedColwise) blocks = packed_block_sizes(tensor, rows, r);
    int64_t start = 0, out_rows = 0;
    for (size_t b = 0; b < blocks.size(); ++b) {
      require_divisible(tensor, 0, blocks[b], tp, blocks.size() > 1 ? fmt::format(" block {}", b) : "");
      const int64_t part = blocks[b] / tp;
      add_range(p, static_cast<uint64_t>((start + k * part) * row_elems) * elem,
                static_cast<uint64_t>(part * row_elems) * elem);
      start += blocks[b];
      out_rows += part;
    }
    p.shape[0] = out_rows;
    return p;
  }

  // Row-wise: split dim 1; trailing dims travel with it.
  const int64_t cols = shape[1];
  const int64_t inner = row_elems / std::max<int64_t>(cols, 1);
  std::vector<int64_t> blocks{cols};
  if (r.style == ShardStyle::PackedRowwise) blocks = packed_block_sizes(tensor, cols, r);
  std::vector<std::pair<int64_t, int64_t>> col_ranges;  // [start, len) in columns
  int64_t start = 0, out_cols = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    require_divisible(tensor, 1, blocks[b], tp, blocks.size() > 1 ? fmt::format(" block {}", b) : "");
    const int64_t part = blocks[b] / tp;
    col_ranges.emplace_back(start + k * part, part);
    start += blocks[b];
    out_cols += part;
  }
  for (int64_t row = 0; row < rows; ++row) {
    for (const auto& [c0, len] : col_ranges) {
      add_range(p, static_cast<uint64_t>(row * row_elems + c0 * inner) * elem,
                static_cast<uint64_t>(len * inner) * elem);
    }
  }
  p.shape[1] = out_cols;
  return p;
}

}  // namespace tprun::checkpoint
