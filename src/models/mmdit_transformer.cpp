// The load and Model interface the MMDiT transformers share (see mmdit_transformer.h).
#include "models/mmdit_transformer.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/model_builder.h"
#include "models/nn_ops.h"
#include "runtime/error.h"

namespace tprun::models {

void check_rope_axes(const std::vector<int64_t>& axes_dims_rope, int64_t head_dim, const std::string& path) {
  int64_t rope_sum = 0;
  for (int64_t d : axes_dims_rope) {
    if (d % 2 != 0) {
      throw CheckpointError(fmt::format("{}: field 'axes_dims_rope' entries must be even and positive", path));
    }
    rope_sum += d;
  }
  if (rope_sum != head_dim) {
    throw CheckpointError(fmt::format("{}: field 'axes_dims_rope' sums to {} but attention_head_dim is {}", path,
                                      rope_sum, head_dim));
  }
}

TensorMap MmditTransformer::forward(const TensorMap& inputs, Trace* trace) const {
  return {{"sample", run(inputs, trace)}};
}

int64_t MmditTransformer::all_reduces_per_forward() const {
  if (tp_.size == 1) return 0;
  return 2 * shape_.dual_blocks + shape_.single_blocks + (shard_modulation_ ? 1 : 0);
}

void MmditTransformer::load_weights(const char* cls, checkpoint::WeightSource& source, const parallel::TpContext& tp,
                                    const ModelOptions& options, const std::vector<std::string>& class_skip,
                                    const Shape& shape, const std::function<void(ModelBuilder&)>& declare) {
  tp_ = tp;
  shape_ = shape;
  shard_modulation_ = options.shard_modulation;
  attention_chunk_ = nn::checked_attention_chunk(options.memory.attention_chunk);
  BuiltModel built = build_model(cls, source, tp, build_options(options, class_skip), declare);
  table_ = std::move(built.table);
  bytes_loaded_ = built.bytes_read;
  lora_targets_ = built.lora_targets;
  bytes_stored_ = built.bytes_stored;
  nn::log_sdpa_attention(cls, options.device, checkpoint::parse_compute_dtype(options.dtype, "dtype"),
                         shape.heads / tp.size, shape.head_dim, false, attention_chunk_);
}

}  // namespace tprun::models
