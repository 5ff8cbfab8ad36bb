#pragma once
// Convolutions of the VAEs, by one kernel whatever the number of intra-op threads.

#include <cstdint>

namespace at {
class Tensor;
}

namespace tprun::models::nn {

// torch.nn.functional.conv2d (dilation 1, groups 1) on [B, C, H, W]. libtorch gives an fp32 1x1
// convolution of one small batch to its native kernel when one intra-op thread runs and to oneDNN
// otherwise (ConvParams::use_mkldnn), and the two round differently: a VAE decode, and so the image,
// depended on --threads, the CPUs a rank gets and dp (2-3 levels of 255 on a FLUX.2 [klein] image).
// fp32 on CPU (oneDNN built and enabled) therefore always runs oneDNN's convolution, whose bits do not
// depend on the thread count; other dtypes (never sent by thread count) and devices: at::conv2d.
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t stride,
                  int64_t padding);
// torch.nn.functional.conv3d on [B, C, T, H, W] with no time padding (the causal VAEs pad time
// themselves), `padding` on both spatial sides, `time_stride` in time and 1 in space; oneDNN as conv2d.
at::Tensor conv3d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t time_stride,
                  int64_t padding);

}  // namespace tprun::models::nn
