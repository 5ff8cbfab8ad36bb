// The stages generate_batch shares (pipelines/batch_stages.h): finish_batch
// turns each result's decode into frames [F, H, W, 3] and bytes, an image
// ([1, 3, H, W] from the decoder) exactly as it always did, a frame sequence
// ([1, 3, F, H, W], a video VAE's layout) frame after frame.
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pipelines/batch_stages.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

// Values in [-1, 1] (and past them, for the clamp) that differ at every position.
at::Tensor ramp(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return (at::arange(n, at::kFloat) * 0.37).sin().mul(1.2).reshape(shape);
}

// round(255 * clamp(x / 2 + 0.5, 0, 1)) for one value, computed apart from libtorch.
uint8_t byte_of(float x) {
  const float v = std::min(1.0f, std::max(0.0f, x / 2 + 0.5f));
  return static_cast<uint8_t>(std::nearbyint(v * 255));
}

TEST(FinishBatch, AnImageIsOneFrameLaidOutAsBefore) {
  const int64_t h = 3, w = 5;
  const at::Tensor decoded = ramp({1, 3, h, w});
  const at::Tensor latents = at::zeros({2, 4, 8});  // a batch of two
  int calls = 0;
  const auto res = finish_batch(latents, h, w, 2, "fp32",
                                [&](const at::Tensor& lat) {
                                  ++calls;
                                  EXPECT_EQ(lat.sizes(), (at::IntArrayRef{1, 4, 8}));
                                  return decoded;
                                },
                                StageTimes{});
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(calls, 2);
  for (const auto& r : res) {
    EXPECT_EQ(r.frames, 1);
    EXPECT_EQ(r.height, h);
    EXPECT_EQ(r.width, w);
    ASSERT_TRUE(r.image);
    EXPECT_EQ(r.image->sizes(), (at::IntArrayRef{1, h, w, 3}));
    ASSERT_EQ(r.rgb.size(), static_cast<size_t>(h * w * 3));
    EXPECT_EQ(r.frame_rgb(0), r.rgb.data());
    const at::Tensor x = decoded.contiguous();
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t c = 0; c < 3; ++c) {
        for (int64_t xx = 0; xx < w; ++xx) {
          ASSERT_EQ(r.rgb[static_cast<size_t>((y * w + xx) * 3 + c)], byte_of(x[0][c][y][xx].item<float>()))
              << y << "," << xx << "," << c;
        }
      }
    }
    // The float frames and the bytes agree.
    EXPECT_TRUE(at::equal((*r.image * 255).round().to(at::kByte).flatten(),
                          at::from_blob(const_cast<uint8_t*>(r.rgb.data()), {h * w * 3}, at::kByte)));
  }
}

TEST(FinishBatch, AFiveDimensionalDecodeGivesFrames) {
  const int64_t f = 4, h = 2, w = 3;
  const at::Tensor decoded = ramp({1, 3, f, h, w});
  const auto res = finish_batch(at::zeros({1, 6, 8}), h, w, 2, "fp32", [&](const at::Tensor&) { return decoded; },
                                StageTimes{});
  ASSERT_EQ(res.size(), 1u);
  const GenerationResult& r = res[0];
  EXPECT_TRUE(r.error.empty());
  EXPECT_EQ(r.frames, f);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(r.image->sizes(), (at::IntArrayRef{f, h, w, 3}));
  ASSERT_EQ(r.rgb.size(), static_cast<size_t>(f * h * w * 3));
  for (int64_t k = 0; k < f; ++k) {
    const uint8_t* frame = r.frame_rgb(k);
    EXPECT_EQ(frame, r.rgb.data() + k * h * w * 3);
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t xx = 0; xx < w; ++xx) {
        for (int64_t c = 0; c < 3; ++c) {
          ASSERT_EQ(frame[(y * w + xx) * 3 + c], byte_of(decoded[0][c][k][y][xx].item<float>()))
              << "frame " << k << " " << y << "," << xx << "," << c;
        }
      }
    }
  }
  // Each frame equals the image a [1, 3, H, W] decode of that frame gives.
  for (int64_t k = 0; k < f; ++k) {
    const at::Tensor one = decoded.select(2, k).contiguous();
    const auto img = finish_batch(at::zeros({1, 6, 8}), h, w, 2, "fp32", [&](const at::Tensor&) { return one; },
                                  StageTimes{});
    EXPECT_TRUE(at::equal(*img[0].image, r.image->slice(0, k, k + 1))) << k;
    EXPECT_EQ(std::vector<uint8_t>(r.frame_rgb(k), r.frame_rgb(k) + h * w * 3), img[0].rgb) << k;
  }
}

TEST(FinishBatch, NonFiniteLatentsAndBadDecodesAreRefused) {
  at::Tensor latents = at::zeros({2, 4, 8});
  latents[1][0][0] = NAN;
  int calls = 0;
  const auto res = finish_batch(latents, 2, 2, 3, "bf16",
                                [&](const at::Tensor&) {
                                  ++calls;
                                  return ramp({1, 3, 2, 2, 2});
                                },
                                StageTimes{});
  EXPECT_EQ(calls, 1);  // the NaN result is never decoded
  EXPECT_EQ(res[0].frames, 2);
  EXPECT_TRUE(res[1].error.find("NaN or Inf after 3 steps (dtype bf16)") != std::string::npos) << res[1].error;
  EXPECT_FALSE(res[1].decoded());
  EXPECT_EQ(res[1].frames, 1);
  // Not [1, 3, F, H, W]: an internal error naming the shape, never a silent frame.
  for (const auto& shape : std::vector<std::vector<int64_t>>{{1, 4, 2, 2, 2}, {2, 3, 2, 2, 2}, {1, 3, 2, 2, 2, 1}}) {
    try {
      finish_batch(at::zeros({1, 4, 8}), 2, 2, 1, "fp32", [&](const at::Tensor&) { return ramp(shape); },
                   StageTimes{});
      ADD_FAILURE() << "accepted a decode of " << at::IntArrayRef(shape);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Internal);
      EXPECT_NE(std::string(e.what()).find("expected [1, 3, H, W] or [1, 3, F, H, W]"), std::string::npos) << e.what();
    }
  }
}

TEST(FinishBatch, WithoutADecoderOnlyLatents) {
  const auto res = finish_batch(at::ones({3, 4, 8}), 16, 16, 1, "fp32", LatentDecoder{}, StageTimes{});
  ASSERT_EQ(res.size(), 3u);
  for (const auto& r : res) {
    EXPECT_FALSE(r.decoded());
    EXPECT_FALSE(r.image);
    ASSERT_TRUE(r.latents);
    EXPECT_EQ(r.frames, 1);
    EXPECT_EQ(r.batch_size, 3);
  }
}

}  // namespace
}  // namespace tprun::pipelines
