#pragma once
// diffusers' FluxTransformer2DModel (FLUX.1) forward, tensor-parallel.
//
// Each rank of a TP group of size p holds the colwise Q/K/V (and feed-forward
// in) projections of heads [r H/p, (r+1) H/p) and the matching row-wise slices
// of the output projections (diffusers' _tp_plan for the class):
//   double blocks: attn.to_q/to_k/to_v, attn.add_q_proj/add_k_proj/add_v_proj,
//                  ff.net.0.proj, ff_context.net.0.proj            colwise
//                  attn.to_out.0, attn.to_add_out, ff.net.2,
//                  ff_context.net.2                                 rowwise
//   single blocks: attn.to_q/to_k/to_v, proj_mlp                    colwise
//                  proj_out (packed [inner_dim, mlp_hidden_dim])    packed rowwise
// Norms, embedders, norm_out and proj_out are replicated; the AdaLN
// modulation linears (norm1.linear, norm1_context.linear, norm.linear) too,
// unless ModelOptions::shard_modulation makes them rowwise_split_input.
// Communication: one AllReduce closes each colwise -> rowwise pair at the block
// boundary, the two streams of a double block coalesced into one call:
//   double block: 1 AllReduce after attention (to_out.0 + to_add_out)
//                 1 AllReduce after the feed-forwards (ff.net.2 + ff_context.net.2)
//   single block: 1 AllReduce (proj_out, packed rowwise over [attn, mlp])
//   shard_modulation: the modulations of every block (rowwise_split_input over
//                 silu(temb), the same for all blocks) are computed up front and
//                 reduced together: 1 more AllReduce per forward.
// So a forward issues 2 * num_layers + num_single_layers AllReduces (+1 with
// shard_modulation), none when p == 1. Outputs are bitwise identical on every
// rank of the group.
//
// Inputs by diffusers' forward argument names: hidden_states [B, S_img, C],
// encoder_hidden_states [B, S_txt, joint_dim], pooled_projections [B, pooled],
// timestep [B], img_ids [S_img, 3], txt_ids [S_txt, 3], guidance [B]
// (required iff the model has guidance_embeds). Output: "sample".

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/mmdit_transformer.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;  // models/model_config.h

struct FluxConfig {
  int64_t heads = 0, head_dim = 0, layers = 0, single_layers = 0;
  int64_t in_channels = 0, out_channels = 0, patch = 1, joint_dim = 0, pooled_dim = 0;
  bool guidance = false;
  std::vector<int64_t> axes_dims_rope;
  double rope_theta = 10000.0;
  int64_t inner() const { return heads * head_dim; }
  // CheckpointError naming the file and field.
  static FluxConfig from_json(const nlohmann::json& config, const std::string& config_path,
                              const TensorCensus* census = nullptr);
};

// Intermediates in execution order, named as the reference's debug file
// ("x_embedder", "transformer_blocks.0.hidden_states", ..., "proj_out").
using FluxTrace = Trace;

struct FluxWeights;  // flux_blocks.h

class FluxTransformer final : public MmditTransformer {
 public:
  static constexpr const char* kClass = "FluxTransformer2DModel";
  // Patterns of the modules the diffusers / transformers class keeps in the
  // compute dtype under layerwise casting (its
  // _skip_layerwise_casting_patterns / _keep_in_fp32_modules).
  static std::vector<std::string> class_skip_patterns() { return {"pos_embed", "norm"}; }

  // The table the construction records (no checkpoint is read).
  static ModelTable table_for(const FluxConfig& config, const ModelOptions& options = {});
  // Validates the table against `source` before any weight byte is read,
  // then loads this rank's slices.
  static std::unique_ptr<FluxTransformer> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                               const std::string& config_path, const parallel::TpContext& tp,
                                               const ModelOptions& options = {});

  // `sample` [B, S_img, patch^2 * out_channels] in the compute dtype.
  // RequestError naming the input for a missing or mis-shaped input (raised
  // alike on every rank that gets the same inputs).
  at::Tensor run(const TensorMap& inputs, FluxTrace* trace = nullptr) const override;

  TensorMap example_inputs(uint64_t seed) const override;

  const FluxConfig& config() const { return config_; }

 private:
  FluxConfig config_;
  std::shared_ptr<const FluxWeights> w_;
};

}  // namespace tprun::models
