#include "models/conv_ops.h"

#include <optional>

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/conv3d.h>
#include <ATen/ops/mkldnn_convolution.h>

namespace tprun::models::nn {

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t stride,
                  int64_t padding) {
  const bool onednn = x.device().is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
                      x.dim() == 4 && at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
  if (!onednn) return at::conv2d(x, weight, bias, {stride, stride}, {padding, padding});
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return at::mkldnn_convolution(x, weight, b, {padding, padding}, {stride, stride}, {1, 1}, 1);
}

at::Tensor conv3d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t time_stride,
                  int64_t padding) {
  const bool onednn = x.device().is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
                      x.dim() == 5 && at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
  if (!onednn) return at::conv3d(x, weight, bias, {time_stride, 1, 1}, {0, padding, padding});
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return at::mkldnn_convolution(x.contiguous(), weight, b, {0, padding, padding}, {time_stride, 1, 1}, {1, 1, 1}, 1);
}

}  // namespace tprun::models::nn
