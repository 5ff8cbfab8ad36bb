#include "checkpoint/shard_style.h"

#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"

namespace tprun::checkpoint {

namespace {

constexpr std::pair<ShardStyle, const char*> kNames[] = {
    {ShardStyle::Replicated, "replicated"},
    {ShardStyle::Colwise, "colwise"},
    {ShardStyle::Rowwise, "rowwise"},
    {ShardStyle::RowwiseSplitInput, "rowwise_split_input"},
    {ShardStyle::PackedColwise, "packed_colwise"},
    {ShardStyle::PackedRowwise, "packed_rowwise"},
};

}  // namespace

const char* shard_style_name(ShardStyle s) {
  for (const auto& [style, name] : kNames)
    if (style == s) return name;
  return "?";
}

int split_dim(ShardStyle s) {
  switch (s) {
    case ShardStyle::Replicated: return -1;
    case ShardStyle::Colwise:
    case ShardStyle::PackedColwise: return 0;
    case ShardStyle::Rowwise:
    case ShardStyle::RowwiseSplitInput:
    case ShardStyle::PackedRowwise: return 1;
  }
  return -1;
}

bool is_packed(ShardStyle s) { return s == ShardStyle::PackedColwise || s == ShardStyle::PackedRowwise; }

bool output_is_partial(ShardStyle s) { return split_dim(s) == 1; }

bool slices_input(ShardStyle s) { return s == ShardStyle::RowwiseSplitInput; }

ShardStyle bias_style(ShardStyle weight) { return split_dim(weight) == 0 ? weight : ShardStyle::Replicated; }

std::vector<int64_t> packed_block_sizes(const std::string& tensor, int64_t dim_size, const ShardRequest& r) {
  if (r.blocks.empty()) {
    throw CheckpointError(fmt::format("tensor '{}': {} needs block sizes", tensor, shard_style_name(r.style)));
  }
  int64_t total = 0;
  for (auto b : r.blocks) {
    if (b <= 0) throw CheckpointError(fmt::format("tensor '{}': block sizes must be positive", tensor));
    if (__builtin_add_overflow(total, b, &total)) {
      throw CheckpointError(fmt::format("tensor '{}': packed block sizes overflow", tensor));
    }
  }
  if (r.blocks_absolute) {
    if (total != dim_size) {
      throw CheckpointError(fmt::format("tensor '{}': packed blocks [{}] sum to {}, but the split dim has {}", tensor,
                                        fmt::join(r.blocks, ", "), total, dim_size));
    }
    return r.blocks;
  }
  if (dim_size % total != 0) {
    throw CheckpointError(fmt::format("tensor '{}': split dim of size {} cannot be cut in proportions [{}]", tensor,
                                      dim_size, fmt::join(r.blocks, ", ")));
  }
  std::vector<int64_t> sizes;
  for (auto b : r.blocks) sizes.push_back(dim_size / total * b);
  return sizes;
}

SplitSpans split_spans(const std::string& tensor, const std::vector<int64_t>& shape, const ShardRequest& r) {
  SplitSpans s;
  s.slice_shape = shape;
  if (r.whole()) return s;
  if (r.tp_size < 1 || r.tp_rank < 0 || r.tp_rank >= r.tp_size) {
    throw CheckpointError(fmt::format("tensor '{}': tp rank {} of {} is out of range", tensor, r.tp_rank, r.tp_size));
  }
  s.dim = split_dim(r.style);
  if (static_cast<int>(shape.size()) <= s.dim) {
    throw CheckpointError(fmt::format("tensor '{}' of shape [{}] cannot be split {}", tensor, fmt::join(shape, ", "),
                                      shard_style_name(r.style)));
  }
  const int64_t size = shape[static_cast<size_t>(s.dim)];
  const std::vector<int64_t> blocks = is_packed(r.style) ? packed_block_sizes(tensor, size, r)
                                                         : std::vector<int64_t>{size};
  int64_t start = 0, local = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b] % r.tp_size != 0) {
      throw CheckpointError(fmt::format("tensor '{}': dim {}{} (size {}) is not divisible by tp {}", tensor, s.dim,
                                        blocks.size() > 1 ? fmt::format(" block {}", b) : "", blocks[b], r.tp_size));
    }
    const int64_t part = blocks[b] / r.tp_size;
    s.spans.emplace_back(start + r.tp_rank * part, part);
    start += blocks[b];
    local += part;
  }
  s.slice_shape[static_cast<size_t>(s.dim)] = local;
  return s;
}

}  // namespace tprun::checkpoint
