#pragma once
// What the MMDiT transformers (FLUX.1, FLUX.2, Qwen-Image) share above
// their blocks: the axes_dims_rope check of their configs, the load (record,
// validate, load this rank's slices, log the attention backend) and the
// Model interface their forwards answer ("sample"; two AllReduces per
// dual-stream block, one per single-stream block, one more with
// shard_modulation). A family keeps its config, its weights and its run().

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/denoiser.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class ModelBuilder;

// axes_dims_rope of an MMDiT config: every entry even and positive, the sum
// equal to attention_head_dim (CheckpointError naming the file and field).
void check_rope_axes(const std::vector<int64_t>& axes_dims_rope, int64_t head_dim, const std::string& config_path);

// run() gives `sample` [B, S_img, patch^2 * out_channels].
class MmditTransformer : public Denoiser {
 public:

  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  std::string primary_output() const override { return "sample"; }
  // 2 * dual-stream blocks + single-stream blocks (+1 with shard_modulation), 0 at tp 1.
  int64_t all_reduces_per_forward() const override;

 protected:
  // The size of the model a load is for: attention heads and head_dim (for
  // the attention log line), the block counts (for the AllReduce count).
  struct Shape {
    int64_t heads = 0, head_dim = 0;
    int64_t dual_blocks = 0, single_blocks = 0;
  };
  // The load every family shares: takes options.shard_modulation and the
  // checked options.memory.attention_chunk, then build_model (record,
  // validate against `source` before any weight byte, load this rank's
  // slices through `declare`) with the family's layerwise-casting skip
  // patterns `class_skip`, and logs the attention backend.
  void load_weights(const char* cls, checkpoint::WeightSource& source, const parallel::TpContext& tp,
                    const ModelOptions& options, const std::vector<std::string>& class_skip, const Shape& shape,
                    const std::function<void(ModelBuilder&)>& declare);

  bool shard_modulation_ = false;

 private:
  Shape shape_;
};

}  // namespace tprun::models
