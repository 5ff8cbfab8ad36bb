#pragma once
// The causal 3-D VAE blocks (causal_vae_blocks.h) over many frames, as
// diffusers' AutoencoderKLWan runs them: the decoder one latent frame at a
// time, the encoder on the first frame and then on chunks of 4 frames, each
// chunk through every block with a per-layer feature cache standing in for
// the frames before it. Internal to WanVae (wan_vae.h). Not a public API.
//
// The feature cache (diffusers' feat_cache / feat_idx, CACHE_T = 2): one slot
// per cached call, in call order, the same order in every chunk.
//   * A causal conv with time padding (conv_in, each residual block's conv1 /
//     conv2, conv_out) runs on [its slot's frames, the chunk], zero-padded in
//     front to the kernel's 2 frames of history when the slot holds fewer
//     (the first chunk: none), and then keeps the chunk's last 2 input frames
//     (the slot's last frame in front when the chunk has one frame). 1x1x1
//     convs (shortcuts, quant_conv, post_quant_conv) take no slot.
//   * upsample3d: the first chunk marks its slot "Rep" and skips time_conv
//     (one frame in, one out: the first chunk emits one frame). Later chunks
//     run time_conv (C -> 2C, zero history after "Rep", else the slot's
//     frames), whose two channel halves become frames 2t and 2t + 1 (the
//     halves interleaved as frames), so each doubles its frames; the slot
//     keeps the last 2 input frames (zeros in front after "Rep").
//   * downsample3d: the spatial downsampling per frame, then the first chunk
//     stores its frames and skips time_conv; later chunks run time_conv
//     (kernel 3, stride 2, no padding) on [the slot's last frame, the chunk]
//     and keep the chunk's last frame.
//   * Attention, RMS norms and the 2-D resamplers act per frame.
// The decoder thus turns latent frame 0 into 1 frame and every later one into
// 4 (two upsample3d); the encoder turns frame 0 into 1 latent frame and each
// chunk of 4 into 1 (two downsample3d).

#include <cstdint>

#include "models/causal_vae_blocks.h"
#include "models/tensor_map.h"

namespace at {
class Tensor;
}

namespace tprun::models {

// z [b, z_dim, F, h, w] (on the weights' device and dtype) -> samples
// [b, out_channels, 1 + 4 (F - 1), 8h, 8w] (with two upsample3d and three
// 2x upsamplings), unclamped: post_quant_conv, then the decoder one latent
// frame at a time with one feature cache. `trace` (may be null) gets
// "post_quant_conv" and "decoder" (the whole decoded video).
at::Tensor causal_decode_video(const CausalVaeWeights& w, const at::Tensor& z, Trace* trace);

// x [b, in_channels, 1 + 4k, H, W] (on the weights' device and dtype) ->
// moments cat(mean, logvar) [b, 2 z_dim, 1 + k, h, w]: the encoder on frame 0
// and then on frames 1 + 4(i-1) .. 4i with one feature cache, then
// quant_conv. `trace` gets "encoder" and "quant_conv".
at::Tensor causal_encode_video(const CausalVaeWeights& w, const at::Tensor& x, Trace* trace);

}  // namespace tprun::models
