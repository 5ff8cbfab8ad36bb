#pragma once
// Internal to AutoencoderKL: the weights of its blocks, how each is read from
// a checkpoint, and the block forwards over NCHW tensors (vae_blocks.cpp).
// Semantics are diffusers' (models/resnet.py, upsampling.py, downsampling.py,
// unets/unet_2d_blocks.py, attention_processor.py). Not a public API.

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_builder.h"

namespace at {
class Tensor;
}

namespace tprun::models {

// ResnetBlock2D (time_embedding_norm "default", no temb, output_scale 1):
// out = shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))),
// shortcut = 1x1 conv_shortcut when in != out channels, else identity.
struct ResnetWeights {
  Affine norm1, conv1, norm2, conv2, conv_shortcut;
  bool has_shortcut = false;
};

// Attention(_from_deprecated_attn_block, one head of all channels, group_norm,
// residual_connection, rescale_output_factor 1) over the H*W tokens.
struct AttentionWeights {
  Affine group_norm;
  parallel::ParallelLinear to_q, to_k, to_v, to_out;
};

// UNetMidBlock2D: resnets[0], then (attentions[i]?, resnets[i+1]).
struct MidBlockWeights {
  std::vector<ResnetWeights> resnets;
  std::vector<AttentionWeights> attentions;  // empty without mid_block_add_attention
};

// UpDecoderBlock2D / DownEncoderBlock2D: resnets, then an optional sampler
// conv (Upsample2D: nearest x2, conv 3x3 pad 1; Downsample2D with padding 0:
// pad (0,1,0,1), conv 3x3 stride 2).
struct SampleBlockWeights {
  std::vector<ResnetWeights> resnets;
  Affine sampler;
  bool has_sampler = false;
};

struct VaeCoderWeights {
  Affine conv_in;
  std::vector<SampleBlockWeights> blocks;  // encoder.down_blocks / decoder.up_blocks
  MidBlockWeights mid;
  Affine conv_norm_out, conv_out;
};

struct VaeWeights {
  VaeCoderWeights encoder, decoder;
  Affine quant_conv, post_quant_conv;  // weight null when absent
  parallel::Weight bn_mean, bn_var;    // AutoencoderKLFlux2's latent statistics [4 * latent_channels]
  int64_t attention_chunk = 0;         // MemoryOptions::attention_chunk, for the mid-block attentions
};

// Declarations (module order as diffusers' state_dict).
ResnetWeights declare_resnet(ModelBuilder& b, const std::string& prefix, int64_t in, int64_t out);
AttentionWeights declare_attention(ModelBuilder& b, const std::string& prefix, int64_t channels);
// UNetMidBlock2D: attentions.0 (when `attention`), resnets.0, resnets.1.
MidBlockWeights declare_mid_block(ModelBuilder& b, const std::string& prefix, int64_t channels, bool attention);

// Forwards. `groups` = norm_num_groups; eps 1e-6 throughout (as diffusers' VAE).
at::Tensor conv2d(const at::Tensor& x, const Affine& w, int64_t stride = 1, int64_t padding = 1);
at::Tensor group_norm(const at::Tensor& x, const Affine& w, int64_t groups);
at::Tensor resnet_forward(const ResnetWeights& w, const at::Tensor& x, int64_t groups);
// `attention_chunk`: the H*W queries in chunks of at most that many tokens
// (nn::sdpa; 0 = one call).
at::Tensor attention_forward(const AttentionWeights& w, const at::Tensor& x, int64_t groups,
                             int64_t attention_chunk);
at::Tensor mid_block_forward(const MidBlockWeights& w, const at::Tensor& x, int64_t groups, int64_t attention_chunk);
at::Tensor up_block_forward(const SampleBlockWeights& w, const at::Tensor& x, int64_t groups);
at::Tensor down_block_forward(const SampleBlockWeights& w, const at::Tensor& x, int64_t groups);

}  // namespace tprun::models
