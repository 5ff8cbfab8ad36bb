#pragma once
// diffusers' FluxTransformer2DModel (FLUX.1) forward, tensor-parallel.
//
// Each rank of a TP group of size p holds the colwise Q/K/V (and feed-forward
// in) projections of heads [r H/p, (r+1) H/p) and the matching row-wise slices
// of the output projections, as the model table plans them. Communication:
// one AllReduce closes each colwise -> rowwise pair at the block boundary, the
// two streams of a double block coalesced into one call (their flattened
// partial sums concatenated):
//   double block: 1 AllReduce after attention (to_out.0 + to_add_out)
//                 1 AllReduce after the feed-forwards (ff.net.2 + ff_context.net.2)
//   single block: 1 AllReduce (proj_out, packed rowwise over [attn, mlp])
//   shard_modulation: the AdaLN modulations of every block (rowwise_split_input
//                 over silu(temb), which is the same for all blocks) are computed
//                 up front and reduced together: 1 more AllReduce per forward.
// So a forward issues 2 * num_layers + num_single_layers AllReduces (+1 with
// shard_modulation), none when p == 1. Row-wise biases are added once, after
// the reduce. Everything else (embedders, norms, norm_out, proj_out) is
// replicated, so outputs are bitwise identical on every rank of the group.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/shard_loader.h"
#include "models/model_table.h"
#include "models/tensor_map.h"
#include "parallel/tp_context.h"

namespace at {
class Tensor;
}

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

struct FluxConfig {
  int64_t heads = 0, head_dim = 0, layers = 0, single_layers = 0;
  int64_t in_channels = 0, out_channels = 0, patch = 1, joint_dim = 0, pooled_dim = 0;
  bool guidance = false;
  std::vector<int64_t> axes_dims_rope;
  double rope_theta = 10000.0;
  int64_t inner() const { return heads * head_dim; }
  // CheckpointError naming the file and field.
  static FluxConfig from_json(const nlohmann::json& config, const std::string& config_path);
};

struct FluxLoadOptions {
  std::string dtype = "fp32";  // compute dtype: fp32 | bf16 | fp16
  std::string device = "cpu";
  checkpoint::LoadMode mode = checkpoint::LoadMode::ShardOnLoad;
  bool shard_modulation = false;  // AdaLN modulation linears rowwise_split_input
};


// Inputs by diffusers' forward argument names: hidden_states [B, S_img, C],
// encoder_hidden_states [B, S_txt, joint_dim], pooled_projections [B, pooled],
// timestep [B], img_ids [S_img, 3], txt_ids [S_txt, 3], guidance [B]
// (required iff the model has guidance_embeds).

// Intermediates in execution order, named as the reference's debug file
// ("x_embedder", "transformer_blocks.0.hidden_states", ..., "proj_out").
using FluxTrace = Trace;

struct FluxWeights;  // flux_blocks.h

class FluxTransformer {
 public:
  // Validates (above), then loads this rank's slices through a ShardLoader.
  static FluxTransformer load(checkpoint::WeightSource& source, const nlohmann::json& config,
                              const std::string& config_path, const parallel::TpContext& tp,
                              const FluxLoadOptions& options = {});

  // `sample` [B, S_img, patch^2 * out_channels] in the compute dtype.
  // RequestError naming the input for a missing or mis-shaped input (raised
  // alike on every rank that gets the same inputs).
  at::Tensor forward(const TensorMap& inputs, FluxTrace* trace = nullptr) const;

  // AllReduces one forward issues on the TP communicator (see above).
  int64_t all_reduces_per_forward() const;

  const FluxConfig& config() const { return config_; }
  const parallel::TpContext& tp() const { return tp_; }
  uint64_t bytes_loaded() const { return bytes_loaded_; }

 private:
  FluxConfig config_;
  parallel::TpContext tp_;
  bool shard_modulation_ = false;
  uint64_t bytes_loaded_ = 0;
  std::shared_ptr<const FluxWeights> w_;
};

// The component's config.json: from an HDF5 checkpoint's attribute or the
// folder's config.json; `config_path` receives a name for messages.
nlohmann::json read_component_config(const std::string& path, std::string* config_path);

}  // namespace tprun::models
