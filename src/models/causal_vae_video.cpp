// The causal 3-D VAE blocks over many frames with diffusers' feature cache
// (causal_vae_video.h says how the cache behaves).
#include "models/causal_vae_video.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

#include "models/conv_ops.h"
#include "parallel/weight.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

constexpr int64_t kCacheT = 2;  // diffusers' CACHE_T

// One cached call's state: nothing yet (the first chunk), "Rep" (upsample3d
// after the first chunk), or the frames kept from the previous chunk.
struct CacheSlot {
  bool set = false;
  bool rep = false;
  at::Tensor frames;
};

class FeatureCache {
 public:
  // The slot of the next cached call of this chunk (a deque: references stay valid).
  CacheSlot& next() {
    if (idx_ == slots_.size()) slots_.emplace_back();
    return slots_[idx_++];
  }
  void start_chunk() { idx_ = 0; }

 private:
  std::deque<CacheSlot> slots_;
  size_t idx_ = 0;
};

// The last `n` frames of x (all of them when it has fewer), as a copy.
at::Tensor last_frames(const at::Tensor& x, int64_t n) {
  return x.slice(2, std::max<int64_t>(0, x.size(2) - n)).clone();
}

// WanCausalConv3d.forward(x, cache_x): the cached frames stand in for as many
// of the time padding's zeros (used only when the conv pads time).
at::Tensor causal_conv(const at::Tensor& x, const CausalConvWeights& w, const at::Tensor& cache) {
  at::Tensor in = x;
  int64_t front = w.time_pad;
  if (cache.defined() && w.time_pad > 0) {
    in = at::cat({cache.to(x.device()), x}, 2);
    front -= cache.size(2);
  }
  if (front > 0) in = at::constant_pad_nd(in, {0, 0, 0, 0, front, 0}, 0);
  const at::Tensor weight = w.weight.get();
  if (weight.dim() != 5) {
    throw Error(Error::Kind::Internal, "causal_conv: a many-frame run needs the 5-D causal conv weights");
  }
  return nn::conv3d(in, weight, w.bias.get(), w.time_stride, w.padding);
}

// A cached causal conv: conv(x, slot), then the slot keeps x's last 2 frames
// (with the slot's last frame in front when x has one).
at::Tensor cached_conv(const at::Tensor& x, const CausalConvWeights& w, FeatureCache& cache) {
  CacheSlot& slot = cache.next();
  at::Tensor keep = last_frames(x, kCacheT);
  if (keep.size(2) < kCacheT && slot.frames.defined()) {
    keep = at::cat({slot.frames.slice(2, slot.frames.size(2) - 1).to(keep.device()), keep}, 2);
  }
  at::Tensor out = causal_conv(x, w, slot.frames);
  slot.set = true;
  slot.frames = std::move(keep);
  return out;
}

// f over each frame of x [b, c, t, h, w] as a [b t, c, h, w] batch, back to [b, c', t, h', w'].
template <class F>
at::Tensor per_frame(const at::Tensor& x, F&& f) {
  const int64_t b = x.size(0), t = x.size(2);
  const at::Tensor frames = x.permute({0, 2, 1, 3, 4}).reshape({b * t, x.size(1), x.size(3), x.size(4)});
  const at::Tensor y = f(frames);
  return y.reshape({b, t, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4}).contiguous();
}

at::Tensor norm_silu(const at::Tensor& x, const parallel::Weight& gamma) {
  at::Tensor h = causal_rms_norm(x, gamma);
  at::silu_(h);
  return h;
}

at::Tensor residual_video(const CausalResidualWeights& w, const at::Tensor& x, FeatureCache& cache) {
  const at::Tensor shortcut = w.has_shortcut ? causal_conv(x, w.conv_shortcut, at::Tensor()) : x;
  at::Tensor h = cached_conv(norm_silu(x, w.norm1), w.conv1, cache);
  h = cached_conv(norm_silu(h, w.norm2), w.conv2, cache);
  return h.add_(shortcut);
}

at::Tensor attention_video(const CausalAttentionWeights& w, const at::Tensor& x, int64_t attention_chunk) {
  return per_frame(x, [&](const at::Tensor& f) { return attention_frame(w, f, attention_chunk); });
}

at::Tensor mid_block_video(const CausalMidBlockWeights& w, const at::Tensor& x, FeatureCache& cache,
                           int64_t attention_chunk) {
  at::Tensor h = residual_video(w.resnet0, x, cache);
  h = attention_video(w.attention, h, attention_chunk);
  return residual_video(w.resnet1, h, cache);
}

void check_time_conv(const CausalResampleWeights& w) {
  if (!w.time_conv.weight.defined()) {
    throw Error(Error::Kind::Internal, "resample_video: the 3-D resampler's time_conv is not loaded");
  }
}

at::Tensor resample_video(const CausalResampleWeights& w, const at::Tensor& x_in, FeatureCache& cache) {
  at::Tensor x = x_in;
  if (w.up && w.time) {  // upsample3d
    check_time_conv(w);
    CacheSlot& slot = cache.next();
    if (!slot.set) {
      slot.set = true;
      slot.rep = true;  // the first chunk: no time_conv
    } else {
      const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), wd = x.size(4);
      at::Tensor keep = last_frames(x, kCacheT);
      if (keep.size(2) < kCacheT) {
        keep = slot.rep ? at::cat({at::zeros_like(keep), keep}, 2)
                        : at::cat({slot.frames.slice(2, slot.frames.size(2) - 1).to(keep.device()), keep}, 2);
      }
      const at::Tensor y = causal_conv(x, w.time_conv, slot.rep ? at::Tensor() : slot.frames);
      slot.rep = false;
      slot.frames = std::move(keep);
      // [b, 2c, t] -> [b, 2, c, t] -> frames (t, half): half 0 is frame 2t, half 1 frame 2t + 1.
      x = y.reshape({b, 2, c, t, h, wd}).permute({0, 2, 3, 1, 4, 5}).reshape({b, c, 2 * t, h, wd});
    }
  }
  x = per_frame(x, [&](const at::Tensor& f) { return resample_frame(w, f); });
  if (!w.up && w.time) {  // downsample3d
    check_time_conv(w);
    CacheSlot& slot = cache.next();
    if (!slot.set) {
      slot.set = true;
      slot.frames = x.clone();  // the first chunk: kept, no time_conv
    } else {
      at::Tensor keep = last_frames(x, 1);
      x = causal_conv(at::cat({slot.frames.slice(2, slot.frames.size(2) - 1).to(x.device()), x}, 2), w.time_conv,
                      at::Tensor());
      slot.frames = std::move(keep);
    }
  }
  return x;
}

at::Tensor decoder_chunk(const CausalDecoderWeights& d, const at::Tensor& x, FeatureCache& cache,
                         int64_t attention_chunk) {
  at::Tensor h = cached_conv(x, d.conv_in, cache);
  h = mid_block_video(d.mid, h, cache, attention_chunk);
  for (const auto& blk : d.up) {
    for (const auto& r : blk.resnets) h = residual_video(r, h, cache);
    if (blk.has_upsampler) h = resample_video(blk.upsampler, h, cache);
  }
  return cached_conv(norm_silu(h, d.norm_out), d.conv_out, cache);
}

at::Tensor encoder_chunk(const CausalEncoderWeights& e, const at::Tensor& x, FeatureCache& cache,
                         int64_t attention_chunk) {
  at::Tensor h = cached_conv(x, e.conv_in, cache);
  for (const auto& layer : e.down) {
    h = layer.is_resample ? resample_video(layer.resample, h, cache) : residual_video(layer.resnet, h, cache);
  }
  h = mid_block_video(e.mid, h, cache, attention_chunk);
  return cached_conv(norm_silu(h, e.norm_out), e.conv_out, cache);
}

}  // namespace

at::Tensor causal_decode_video(const CausalVaeWeights& w, const at::Tensor& z, Trace* trace) {
  const at::Tensor x = causal_conv(z, w.post_quant_conv, at::Tensor());
  if (trace) trace->emplace_back("post_quant_conv", x);
  FeatureCache cache;
  std::vector<at::Tensor> chunks;
  for (int64_t i = 0; i < x.size(2); ++i) {
    cache.start_chunk();
    chunks.push_back(decoder_chunk(w.decoder, x.slice(2, i, i + 1), cache, w.attention_chunk));
  }
  at::Tensor out = chunks.size() == 1 ? chunks.front() : at::cat(chunks, 2);
  if (trace) trace->emplace_back("decoder", out);
  return out;
}

at::Tensor causal_encode_video(const CausalVaeWeights& w, const at::Tensor& x, Trace* trace) {
  FeatureCache cache;
  std::vector<at::Tensor> chunks;
  const int64_t n = 1 + (x.size(2) - 1) / 4;
  for (int64_t i = 0; i < n; ++i) {
    cache.start_chunk();
    const at::Tensor chunk = i == 0 ? x.slice(2, 0, 1) : x.slice(2, 1 + 4 * (i - 1), 1 + 4 * i);
    chunks.push_back(encoder_chunk(w.encoder, chunk, cache, w.attention_chunk));
  }
  const at::Tensor out = chunks.size() == 1 ? chunks.front() : at::cat(chunks, 2);
  if (trace) trace->emplace_back("encoder", out);
  at::Tensor moments = causal_conv(out, w.quant_conv, at::Tensor());
  if (trace) trace->emplace_back("quant_conv", moments);
  return moments;
}

}  // namespace tprun::models
