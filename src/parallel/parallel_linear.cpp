#include "parallel/parallel_linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <fmt/format.h>

#include "dist/communicator.h"
#include "parallel/lora_slot.h"
#include "parallel/matmul_trace.h"
#include "runtime/error.h"

namespace tprun::parallel {

using checkpoint::ShardStyle;

namespace {

void record_linear(const at::Tensor& x, const at::Tensor& w, ShardStyle style, int tp_size) {
  MatmulShape s;
  s.m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  s.k = w.size(1);
  s.n = w.size(0);
  s.tp_share = style == ShardStyle::Replicated ? 1 : tp_size;
  MatmulRecorder::record(s);
}

}  // namespace

ParallelLinear::ParallelLinear(std::string name, ShardStyle style, std::vector<int64_t> in_blocks,
                               const TpContext& tp, Weight weight, Weight bias)
    : name_(std::move(name)),
      style_(style),
      tp_(tp),
      in_blocks_(std::move(in_blocks)),
      weight_(std::move(weight)),
      bias_(std::move(bias)) {
  check_tp_context(tp_);
  if (checkpoint::slices_input(style_) && in_blocks_.empty()) {
    throw Error(Error::Kind::Internal, fmt::format("{}: rowwise_split_input needs the full input dim", name_));
  }
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
  if (tp_.size == 1) return x;
  std::vector<at::Tensor> parts;
  int64_t offset = 0;
  for (int64_t b : in_blocks_) {
    const int64_t piece = b / tp_.size;
    parts.push_back(x.narrow(-1, offset + tp_.rank * piece, piece));
    offset += b;
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, -1);
}

at::Tensor ParallelLinear::partial(const at::Tensor& x) const {
  const at::Tensor w = weight_.get();
  const at::Tensor in = checkpoint::slices_input(style_) ? slice_input(x) : x;
  record_linear(in, w, style_, tp_.size);
  at::Tensor y = at::linear(in, w);
  // A row-wise layer's adapter term is part of its partial sum: sum_r (x_r A_r^T) = x A^T.
  if (lora_ && !lora_->deltas.empty()) add_lora_terms(y, in, *lora_);
  return y;
}

at::Tensor ParallelLinear::add_bias(const at::Tensor& reduced) const {
  return bias_.defined() ? reduced + bias_.get() : reduced;
}

at::Tensor ParallelLinear::forward(const at::Tensor& x) const {
  if (!checkpoint::output_is_partial(style_)) {
    const at::Tensor w = weight_.get();
    record_linear(x, w, style_, tp_.size);
    at::Tensor y = bias_.defined() ? at::linear(x, w, bias_.get()) : at::linear(x, w);
    if (lora_ && !lora_->deltas.empty()) add_lora_terms(y, x, *lora_);
    return y;
  }
  return rowwise_forward(RowwiseBatch().add(*this, x))[0];
}

std::vector<at::Tensor> all_reduce_coalesced(const TpContext& tp, const std::vector<at::Tensor>& partials) {
  if (tp.size == 1 || partials.empty()) return partials;
  if (!tp.comm) throw Error(Error::Kind::Internal, "tp > 1 without a communicator");
  std::vector<at::Tensor> flat;
  flat.reserve(partials.size());
  for (const auto& p : partials) flat.push_back(p.reshape({-1}));
  // One partial: reduce it in place (it is a fresh output nobody else holds).
  at::Tensor buf = flat.size() == 1 ? flat[0].contiguous() : at::cat(flat, 0);
  tp.comm->all_reduce(buf);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& p : partials) {
    out.push_back(buf.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

std::vector<at::Tensor> rowwise_forward(const RowwiseBatch& batch) {
  if (batch.calls.empty()) return {};
  const TpContext& tp = batch.calls.front().layer->tp();
  std::vector<at::Tensor> partials;
  partials.reserve(batch.calls.size());
  for (const auto& c : batch.calls) {
    const ParallelLinear& l = *c.layer;
    if (!checkpoint::output_is_partial(l.style())) {
      throw Error(Error::Kind::Internal,
                  fmt::format("{}: rowwise_forward on a {} layer", l.name(), checkpoint::shard_style_name(l.style())));
    }
    if (l.tp().comm != tp.comm || l.tp().size != tp.size) {
      throw Error(Error::Kind::Internal,
                  fmt::format("{}: rowwise_forward over layers of different TP groups", l.name()));
    }
    partials.push_back(l.partial(*c.input));
  }
  std::vector<at::Tensor> out = all_reduce_coalesced(tp, partials);
  for (size_t i = 0; i < out.size(); ++i) out[i] = batch.calls[i].layer->add_bias(out[i]);
  return out;
}

}  // namespace tprun::parallel
