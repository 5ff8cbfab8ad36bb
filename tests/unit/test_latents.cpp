// FLUX.1 latents: seeded noise, 2x2 packing, image ids, size checks; against
// FluxPipeline's reference tensors (tests/data/flux_pipeline, from shared/ref).

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "checkpoint/tensor_file.h"
#include "pipelines/latents.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::pipelines {
namespace {

namespace fs = std::filesystem;

fs::path pipeline_case() { return test::data_dir("flux_pipeline"); }

std::string request_error(int64_t height, int64_t width, int64_t vae_scale_factor = 8) {
  try {
    check_image_size(height, width, vae_scale_factor);
  } catch (const RequestError& e) {
    return e.what();
  }
  return "";
}

TEST(Latents, PackUnpackIsIdentity) {
  const at::Tensor x = at::randn({2, 16, 8, 12});
  const at::Tensor packed = pack_latents(x);
  EXPECT_EQ(packed.sizes(), (std::vector<int64_t>{2, 4 * 6, 64}));
  // A 64x96 image with the VAE's 8x gives the 8x12 latent.
  const at::Tensor back = unpack_latents(packed, 64, 96, 8);
  EXPECT_TRUE(at::equal(back, x));
  // And packing the unpacked tokens gives the tokens back.
  EXPECT_TRUE(at::equal(pack_latents(unpack_latents(packed, 64, 96, 8)), packed));
  EXPECT_THROW(unpack_latents(packed, 64, 64, 8), Error);
  EXPECT_THROW(pack_latents(at::randn({1, 16, 3, 4})), Error);
}

TEST(Latents, PackOrderHandComputed) {
  // [1, 2, 2, 4]: channel c, row y, column x holds c*100 + y*10 + x. Token (0, j)
  // holds, channel-major, the 2x2 patch at columns 2j, 2j+1: c, dy, dx order.
  const at::Tensor x = at::arange(16, at::TensorOptions().dtype(at::kFloat)).reshape({1, 2, 2, 4});
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < 2; ++y)
      for (int64_t w = 0; w < 4; ++w) x[0][c][y][w].fill_(static_cast<double>(c * 100 + y * 10 + w));
  const at::Tensor p = pack_latents(x);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{1, 2, 8}));
  const std::vector<float> token1 = {2, 3, 12, 13, 102, 103, 112, 113};
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(p[0][1][k].item<float>(), token1[static_cast<size_t>(k)]) << k;
  EXPECT_EQ(p[0][0][0].item<float>(), 0.0f);
  EXPECT_EQ(p[0][0][3].item<float>(), 11.0f);
}

TEST(Latents, ImageIdsHandComputed) {
  const at::Tensor ids = latent_image_ids(2, 3);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{6, 3}));
  EXPECT_EQ(ids.scalar_type(), at::kFloat);
  const float want[6][3] = {{0, 0, 0}, {0, 0, 1}, {0, 0, 2}, {0, 1, 0}, {0, 1, 1}, {0, 1, 2}};
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(ids[i][k].item<float>(), want[i][k]) << i << "," << k;
  EXPECT_EQ(latent_image_ids(2, 3, at::kBFloat16).scalar_type(), at::kBFloat16);
}

TEST(Latents, ImageIdsMatchFluxPipeline) {
  const auto debug = checkpoint::read_tensor_file((pipeline_case() / "debug.safetensors").string());
  // 32x32 image, the case's VAE scale factor 2: 16x16 latent, 8x8 tokens.
  EXPECT_EQ(image_seq_len(32, 32, 2), 64);
  const at::Tensor ids = latent_image_ids(latent_side(32, 2) / 2, latent_side(32, 2) / 2);
  EXPECT_TRUE(at::equal(ids, debug.at("img_ids")));
}

TEST(Latents, SizeErrorsNameValueAndMultiple) {
  EXPECT_EQ(request_error(1024, 1024), "");
  EXPECT_EQ(request_error(32, 48, 2), "");
  EXPECT_NE(request_error(1000, 1024).find("height 1000 is not a multiple of 16"), std::string::npos)
      << request_error(1000, 1024);
  EXPECT_NE(request_error(1024, 1030).find("width 1030 is not a multiple of 16"), std::string::npos)
      << request_error(1024, 1030);
  EXPECT_NE(request_error(30, 32, 2).find("height 30 is not a multiple of 4"), std::string::npos);
  EXPECT_NE(request_error(0, 1024).find("height 0 must be positive"), std::string::npos);
  EXPECT_NE(request_error(1024, -16).find("width -16 must be positive"), std::string::npos);
  EXPECT_THROW(prepare_latents(1, 1, 16, 1000, 1024, at::kFloat, at::kCPU, 8), RequestError);
  EXPECT_EQ(image_seq_len(1024, 1024, 8), 4096);
  EXPECT_EQ(latent_side(1024, 8), 128);
}

TEST(Latents, SeededNoiseIsReproducible) {
  const at::Tensor a = seeded_noise(42, {1, 16, 8, 8}, at::kFloat, at::kCPU);
  const at::Tensor b = seeded_noise(42, {1, 16, 8, 8}, at::kFloat, at::kCPU);
  const at::Tensor c = seeded_noise(43, {1, 16, 8, 8}, at::kFloat, at::kCPU);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(a, c));
  const at::Tensor h = seeded_noise(42, {1, 16, 8, 8}, at::kBFloat16, at::kCPU);
  EXPECT_EQ(h.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(h, seeded_noise(42, {1, 16, 8, 8}, at::kBFloat16, at::kCPU)));
  // Mean ~0, std ~1 over 1024 draws.
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 0.15);
  EXPECT_NEAR(a.std().item<double>(), 1.0, 0.1);
}

TEST(Latents, SeededBf16NoiseIsTorchsBf16Randn) {
  // torch 2.11 (this build's libtorch), Python:
  //   torch.randn((1, 16, 8, 8), generator=torch.Generator("cpu").manual_seed(42), dtype=torch.bfloat16)
  // starts with these values, which is what diffusers' randn_tensor draws for a
  // bf16 pipeline. fp32 randn rounded to bf16 would start 1.9296875, 1.484375, ...
  const at::Tensor h = seeded_noise(42, {1, 16, 8, 8}, at::kBFloat16, at::kCPU).flatten().to(at::kFloat);
  const std::vector<float> want = {-0.80859375f, -1.53125f, 0.40625f, 0.171875f, -0.2470703125f, 0.2041015625f};
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(h[static_cast<int64_t>(k)].item<float>(), want[k]) << k;
}

TEST(Latents, SeededNoiseEqualsFluxPipeline) {
  // The reference's initial latents: FluxPipeline.prepare_latents with
  // torch.Generator().manual_seed(4003), fp32, 32x32 image, VAE scale factor 2,
  // 16 latent channels -> [1, 16, 16, 16] packed to [1, 64, 64].
  const auto inputs = checkpoint::read_tensor_file((pipeline_case() / "inputs.safetensors").string());
  const at::Tensor& want = inputs.at("latents");
  const at::Tensor got = prepare_latents(4003, 1, 16, 32, 32, at::kFloat, at::kCPU, 2);
  ASSERT_EQ(got.sizes(), want.sizes());
  const double diff = (got - want).abs().max().item<double>();
  std::printf("[ latents ] seed 4003 vs FluxPipeline's initial latents: max |diff| %.3g\n", diff);
  EXPECT_LE(diff, 1e-6);
}

}  // namespace
}  // namespace tprun::pipelines
