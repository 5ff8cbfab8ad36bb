#pragma once
// diffusers' Flux2Transformer2DModel (FLUX.2 dev / klein) forward, tensor-parallel.
//
// Each rank of a TP group of size p holds the colwise Q/K/V projections of
// heads [r H/p, (r+1) H/p), its slice of every block of the fused projections,
// and the matching row-wise slices of the output projections (diffusers'
// _tp_plan for the class):
//   double blocks: attn.to_q/to_k/to_v, attn.add_q_proj/add_k_proj/add_v_proj  colwise
//                  ff.linear_in, ff_context.linear_in                packed colwise [mlp, mlp]
//                                                                    (SwiGLU gate | up)
//                  attn.to_out.0, attn.to_add_out, ff.linear_out,
//                  ff_context.linear_out                             rowwise
//   single blocks: attn.to_qkv_mlp_proj  packed colwise [inner, inner, inner, mlp, mlp]
//                                        (rank r's output is [q_r, k_r, v_r, gate_r, up_r])
//                  attn.to_out           packed rowwise [inner, mlp] (input [attn_r, mlp_r])
// with inner = heads * head_dim and mlp = int(inner * mlp_ratio). No layer has
// a bias. Embedders, QK norms, norm_out and proj_out are replicated; so are
// the three Flux2Modulation linears (double_stream_modulation_img / _txt,
// single_stream_modulation: computed once per forward and shared by every
// block of their kind) unless ModelOptions::shard_modulation makes them
// rowwise_split_input.
// Communication: one AllReduce closes each colwise -> rowwise pair, the two
// streams of a double block coalesced into one call:
//   double block: 1 AllReduce after attention (to_out.0 + to_add_out)
//                 1 AllReduce after the feed-forwards (ff.linear_out + ff_context.linear_out)
//   single block: 1 AllReduce (to_out, packed rowwise over [attn, mlp])
//   shard_modulation: the three modulations (rowwise_split_input over
//                 silu(temb)) reduced together: 1 more AllReduce per forward.
// So a forward issues 2 * num_layers + num_single_layers AllReduces (+1 with
// shard_modulation), none when p == 1. Outputs are bitwise identical on every
// rank of the group.
//
// Inputs by diffusers' forward argument names: hidden_states [B, S_img,
// in_channels], encoder_hidden_states [B, S_txt, joint_attention_dim],
// timestep [B], img_ids and txt_ids [S, n] or [1, S, n] with n >= the number
// of RoPE axes (Flux2Pipeline: img (0, row, col, 0), txt (0, 0, 0, l)),
// guidance [B] (required iff the model has guidance_embeds). Output: "sample"
// [B, S_img, patch^2 * out_channels].

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

struct Flux2Config {
  int64_t heads = 48, head_dim = 128, layers = 8, single_layers = 48;
  int64_t in_channels = 128, out_channels = 128, patch = 1, joint_dim = 15360;
  int64_t timestep_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope{32, 32, 32, 32};
  double rope_theta = 2000.0;
  double eps = 1e-6;
  bool guidance = true;
  int64_t inner() const { return heads * head_dim; }
  // int(inner * mlp_ratio), as diffusers computes it (Flux2FeedForward and
  // Flux2ParallelSelfAttention alike).
  int64_t mlp_hidden() const { return static_cast<int64_t>(static_cast<double>(inner()) * mlp_ratio); }
  // Defaults as diffusers' __init__; every value checked and bounded
  // (CheckpointError naming the file and field).
  static Flux2Config from_json(const nlohmann::json& config, const std::string& config_path,
                               const TensorCensus* census = nullptr);
};

struct Flux2Weights;  // flux2_blocks.h

class Flux2Transformer final : public MmditTransformer {
 public:
  static constexpr const char* kClass = "Flux2Transformer2DModel";
  // Patterns of the modules the diffusers / transformers class keeps in the
  // compute dtype under layerwise casting (its
  // _skip_layerwise_casting_patterns / _keep_in_fp32_modules).
  static std::vector<std::string> class_skip_patterns() { return {"pos_embed", "norm"}; }

  // The table the construction records (no checkpoint is read).
  static ModelTable table_for(const Flux2Config& config, const ModelOptions& options = {});
  // Validates the table against `source` before any weight byte is read,
  // then loads this rank's slices.
  static std::unique_ptr<Flux2Transformer> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                const std::string& config_path, const parallel::TpContext& tp,
                                                const ModelOptions& options = {});

  // `sample` in the compute dtype. RequestError naming the input for a
  // missing or mis-shaped input (raised alike on every rank that gets the
  // same inputs). Trace (in execution order): "time_guidance_embed",
  // "x_embedder", "context_embedder", "pos_embed.freqs_cos" / "_sin",
  // "transformer_blocks.{i}.encoder_hidden_states" / ".hidden_states",
  // "single_transformer_blocks.{i}.hidden_states" (the joint [txt, img]
  // stream, as diffusers' single block returns it), "norm_out", "proj_out".
  at::Tensor run(const TensorMap& inputs, Trace* trace = nullptr) const override;

  // An 8 x 8 latent grid and 8 text tokens, N(0, 1), ids as Flux2Pipeline
  // makes them, timestep 0.5 (+ guidance 4.0).
  TensorMap example_inputs(uint64_t seed) const override;

  const Flux2Config& config() const { return config_; }

 private:
  Flux2Config config_;
  std::shared_ptr<const Flux2Weights> w_;
};

}  // namespace tprun::models
