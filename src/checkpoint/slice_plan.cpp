#include "checkpoint/slice_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

}  // namespace

SlicePlan plan_slice(const std::string& tensor, const std::vector<int64_t>& shape, int elem_bits,
                     const ShardRequest& r) {
  SlicePlan p;
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  if (r.whole()) {
    p.shape = shape;
    add_range(p, 0, static_cast<uint64_t>(numel) * elem_bits / 8);
    return p;
  }
  if (elem_bits % 8 != 0) {
    throw CheckpointError(fmt::format("tensor '{}': a {}-bit dtype cannot be split for tensor parallelism",
                                      tensor, elem_bits));
  }
  const SplitSpans split = split_spans(tensor, shape, r);
  const uint64_t elem = static_cast<uint64_t>(elem_bits / 8);
  p.shape = split.slice_shape;
  int64_t row_elems = 1;  // elements per row (all dims after 0)
  for (size_t i = 1; i < shape.size(); ++i) row_elems *= shape[i];

  if (split.dim == 0) {
    // Blocks of rows: one contiguous range each.
    for (const auto& [start, count] : split.spans) {
      add_range(p, static_cast<uint64_t>(start * row_elems) * elem, static_cast<uint64_t>(count * row_elems) * elem);
    }
    return p;
  }
  // Split dim 1: every row contributes one range per block; trailing dims travel with dim 1.
  const int64_t inner = row_elems / std::max<int64_t>(shape[1], 1);
  for (int64_t row = 0; row < shape[0]; ++row) {
    for (const auto& [c0, len] : split.spans) {
      add_range(p, static_cast<uint64_t>(row * row_elems + c0 * inner) * elem,
                static_cast<uint64_t>(len * inner) * elem);
    }
  }
  return p;
}

}  // namespace tprun::checkpoint
