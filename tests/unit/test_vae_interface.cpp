// The Vae interface (models/vae.h) over the three VAE classes of the tiny
// init-model folders (flux: AutoencoderKL, flux2-klein: AutoencoderKLFlux2,
// qwen-image: AutoencoderKLQwenImage):
//   - read_vae_info / vae_shape / Vae::memory_shape give the VaeShape the
//     pipelines' own helpers gave before the interface (kept below as the
//     reference: request_memory's vae_shape of a loaded AutoencoderKL,
//     qwen_image_vae_shape) and the layout gives, field for field, over dtypes
//     and tilings;
//   - denormalize is today's pipeline arithmetic bit for bit (fp32 and bf16)
//     and normalize undoes it;
//   - the shared part handling (part, switches, forward, refusals).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "memory/memory_options.h"
#include "models/autoencoder_kl.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/qwen_image_vae.h"
#include "models/vae.h"
#include "pipelines/pipeline.h"
#include "pipelines/pipeline_layout.h"
#include "pipelines/request_memory.h"
#include "runtime/error.h"
#include "tiny_pipeline.h"

namespace tprun::models {
namespace {

struct VaeFolder {
  std::string dir;  // the pipeline folder's vae/
  nlohmann::json config;
  std::string config_path;
};

VaeFolder vae_folder(const std::string& arch) {
  VaeFolder f;
  f.dir = test::tiny_folder(arch) + "/vae";
  f.config = read_component_config(f.dir, &f.config_path);
  return f;
}

std::unique_ptr<Model> load_vae(const VaeFolder& f, const ModelOptions& options) {
  auto source = checkpoint::open_weight_source(f.dir);
  return load_model(*source, f.config, f.config_path, {}, options);
}

ModelOptions decoder_options(const std::string& dtype, const memory::MemoryOptions& mem) {
  ModelOptions o;
  o.dtype = dtype;
  o.part = "decoder";
  o.memory = mem;
  return o;
}

// The tilings the shapes are compared under: off, on at the default tile, on at a tile of `tile` px.
std::vector<memory::MemoryOptions> tilings(int64_t tile) {
  std::vector<memory::MemoryOptions> out(3);
  out[1].vae_tiling = true;
  out[2].vae_tiling = true;
  out[2].vae_tile_sample_size = tile;
  return out;
}

std::string describe(const std::string& dtype, const memory::MemoryOptions& m) {
  return dtype + (m.vae_tiling ? " tiled " + std::to_string(m.vae_tile_sample_size) : " untiled");
}

// Every field both VaeShapes have.
void expect_same_shape(const VaeShape& mine, const pipelines::VaeShape& old, bool compare_scores,
                       const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(mine.decoder_channels, old.decoder_channels);
  EXPECT_EQ(mine.latent_channels, old.latent_channels);
  EXPECT_EQ(mine.scale_factor, old.scale_factor);
  EXPECT_EQ(mine.elem_bytes, old.elem_bytes);
  if (compare_scores) EXPECT_EQ(mine.scores_materialised, old.scores_materialised);
  EXPECT_EQ(mine.tiling, old.tiling);
  EXPECT_EQ(mine.tile_sample, old.tile_sample);
  EXPECT_EQ(mine.temporal_scale, 1);
}

void expect_same_info(const VaeInfo& a, const VaeInfo& b) {
  EXPECT_EQ(a.cls, b.cls);
  EXPECT_EQ(a.latent_channels, b.latent_channels);
  EXPECT_EQ(a.spatial_scale, b.spatial_scale);
  EXPECT_EQ(a.temporal_scale, b.temporal_scale);
  EXPECT_EQ(a.default_tile_sample, b.default_tile_sample);
  EXPECT_EQ(a.force_upcast, b.force_upcast);
  EXPECT_EQ(a.decoder_channels, b.decoder_channels);
}

// The shapes the memory model counted before the Vae interface, as the
// pipelines computed them (the reference the interface must reproduce).
pipelines::VaeShape reference_kl_shape(const AutoencoderKL& vae, const std::string& device) {
  pipelines::VaeShape s;
  const auto& c = vae.config();
  const auto& enc = c.decoder_block_out_channels.empty() ? c.block_out_channels : c.decoder_block_out_channels;
  s.decoder_channels.assign(enc.rbegin(), enc.rend());
  s.latent_channels = c.latent_channels;
  s.scale_factor = c.scale_factor();
  const c10::ScalarType vst = checkpoint::parse_compute_dtype(vae.compute_dtype(), "vae dtype");
  s.elem_bytes = static_cast<int64_t>(c10::elementSize(vst));
  const std::string vb = nn::sdpa_backend(device, vst, 1, enc.empty() ? 64 : enc.back(), false);
  s.scores_materialised = vb.find("math") != std::string::npos;
  s.tiling = vae.tiling();
  s.tile_sample = vae.tile_sample_size();
  return s;
}

pipelines::VaeShape reference_qwen_shape(const QwenImageVaeConfig& config, const std::string& dtype,
                                         const std::string& device, bool tiling, int64_t tile_sample) {
  pipelines::VaeShape s;
  for (auto it = config.dim_mult.rbegin(); it != config.dim_mult.rend(); ++it) {
    s.decoder_channels.push_back(config.base_dim * *it);
  }
  s.latent_channels = config.z_dim;
  s.scale_factor = config.scale_factor();
  const c10::ScalarType st = checkpoint::parse_compute_dtype(dtype, "vae dtype");
  s.elem_bytes = static_cast<int64_t>(c10::elementSize(st));
  const int64_t widest = s.decoder_channels.empty() ? 64 : s.decoder_channels.front();
  s.scores_materialised = nn::sdpa_backend(device, st, 1, widest, false).find("math") != std::string::npos;
  s.tiling = tiling;
  s.tile_sample = tile_sample > 0 ? tile_sample : 256;
  return s;
}

// AutoencoderKL / AutoencoderKLFlux2: the new shapes against request_memory's
// vae_shape of the loaded VAE and the FLUX layout's (add_vae_decoder).
void check_kl_shapes(const std::string& arch, const std::string& cls) {
  const VaeFolder f = vae_folder(arch);
  const VaeInfo info = read_vae_info(f.config, f.config_path);
  EXPECT_EQ(info.cls, cls);
  for (const std::string dtype : {"fp32", "bf16"}) {
    for (const auto& mem : tilings(4 * info.spatial_scale)) {
      const std::string what = cls + " " + describe(dtype, mem);
      const auto loaded = load_vae(f, decoder_options(dtype, mem));
      const auto* kl = dynamic_cast<const AutoencoderKL*>(loaded.get());
      ASSERT_NE(kl, nullptr) << what;
      const VaeShape from_info = vae_shape(info, vae_compute_dtype(info, dtype), "cpu", mem);
      const pipelines::VaeShape old = reference_kl_shape(*kl, "cpu");
      expect_same_shape(from_info, old, true, what + " (config vs request_memory)");
      expect_same_shape(kl->memory_shape("cpu"), old, true, what + " (loaded vs request_memory)");
      EXPECT_EQ(kl->compute_dtype(), vae_compute_dtype(info, dtype)) << what;
      expect_same_info(kl->info(), info);

      pipelines::PipelineOptions po;
      po.dtype = dtype;
      po.component_base.memory = mem;
      const pipelines::PipelineLayout layout = pipelines::pipeline_layout(test::tiny_folder(arch), po);
      // The layout leaves the backend to the planner.
      expect_same_shape(from_info, layout.vae, false, what + " (config vs layout)");
      const auto* c = layout.find("vae");
      ASSERT_NE(c, nullptr);
      EXPECT_EQ(c->options.dtype, vae_compute_dtype(info, dtype)) << what;
    }
  }
}

TEST(VaeInterface, AutoencoderKLShapesAsTheMemoryModelCountsThem) {
  check_kl_shapes("flux", "AutoencoderKL");
}

TEST(VaeInterface, AutoencoderKLFlux2ShapesAsTheMemoryModelCountsThem) {
  check_kl_shapes("flux2-klein", "AutoencoderKLFlux2");
}

TEST(VaeInterface, QwenImageShapesAsTheMemoryModelCountsThem) {
  const VaeFolder f = vae_folder("qwen-image");
  const VaeInfo info = read_vae_info(f.config, f.config_path);
  EXPECT_EQ(info.cls, "AutoencoderKLQwenImage");
  EXPECT_FALSE(info.force_upcast);
  EXPECT_EQ(info.default_tile_sample, 256);
  const auto cfg = QwenImageVaeConfig::from_json(f.config, f.config_path);
  for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
    for (const auto& mem : tilings(4 * info.spatial_scale)) {
      const std::string what = describe(dtype, mem);
      const pipelines::VaeShape old =
          reference_qwen_shape(cfg, dtype, "cpu", mem.vae_tiling, mem.vae_tile_sample_size);
      const VaeShape from_info = vae_shape(info, vae_compute_dtype(info, dtype), "cpu", mem);
      expect_same_shape(from_info, old, true, what + " (config)");
      const auto loaded = load_vae(f, decoder_options(dtype, mem));
      const auto* q = dynamic_cast<const QwenImageVae*>(loaded.get());
      ASSERT_NE(q, nullptr);
      expect_same_shape(q->memory_shape("cpu"), old, true, what + " (loaded)");
      expect_same_info(q->info(), info);
    }
  }
}

TEST(VaeInterface, ComputeDtypeAndUnknownClasses) {
  VaeInfo info;
  info.force_upcast = true;
  EXPECT_EQ(vae_compute_dtype(info, "bf16"), "fp32");
  EXPECT_EQ(vae_compute_dtype(info, "float16"), "fp32");
  EXPECT_EQ(vae_compute_dtype(info, "fp32"), "fp32");
  info.force_upcast = false;
  EXPECT_EQ(vae_compute_dtype(info, "bfloat16"), "bf16");
  EXPECT_EQ(vae_compute_dtype(info, "fp16"), "fp16");
  EXPECT_THROW(vae_compute_dtype(info, "int8"), ConfigError);

  try {
    read_vae_info({{"_class_name", "AutoencoderKLHunyuanVideo"}}, "vae/config.json");
    ADD_FAILURE() << "an unknown VAE class was read";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    for (const char* want : {"vae/config.json", "AutoencoderKLHunyuanVideo", "AutoencoderKL,", "AutoencoderKLQwenImage",
                             "AutoencoderKLWan"})
      EXPECT_NE(m.find(want), std::string::npos) << m;
  }
  EXPECT_THROW(read_vae_info(nlohmann::json::object(), "vae/config.json"), CheckpointError);
  // The class's own checks: a bad field is refused as from_json refuses it.
  EXPECT_THROW(read_vae_info({{"_class_name", "AutoencoderKLQwenImage"}, {"z_dim", -1}}, "c.json"), CheckpointError);
}

TEST(VaeInterface, WanVideoVaeInfo) {
  // diffusers' AutoencoderKLWan defaults (Wan 2.1): 8x in space, 4x in time, frames on their own axis.
  const VaeInfo info =
      read_vae_info({{"_class_name", "AutoencoderKLWan"}, {"decoder_base_dim", 64}}, "vae/config.json");
  EXPECT_EQ(info.cls, "AutoencoderKLWan");
  EXPECT_EQ(info.latent_channels, 16);
  EXPECT_EQ(info.spatial_scale, 8);
  EXPECT_EQ(info.temporal_scale, 4);
  EXPECT_TRUE(info.frame_axis);
  EXPECT_EQ(info.default_tile_sample, 256);
  EXPECT_EQ(info.decoder_channels, (std::vector<int64_t>{256, 256, 128, 64}));  // decoder_base_dim x reversed(dim_mult)
  // Wan 2.2 TI2V-5B's residual, patchified VAE is refused by name.
  try {
    read_vae_info({{"_class_name", "AutoencoderKLWan"}, {"is_residual", true}, {"patch_size", 2}, {"z_dim", 48}},
                  "vae/config.json");
    ADD_FAILURE() << "the residual Wan 2.2 VAE was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("Wan 2.2 TI2V-5B"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_vae_info({{"_class_name", "AutoencoderKLWan"}, {"scale_factor_temporal", 8}}, "c.json"),
               CheckpointError);
  const nlohmann::json zero_std = {{"_class_name", "AutoencoderKLWan"}, {"latents_std", std::vector<double>(16, 0.0)}};
  EXPECT_THROW(read_vae_info(zero_std, "c.json"), CheckpointError);
}

// A random z in `dtype` (values of a few units, as latents are).
at::Tensor random_z(std::vector<int64_t> shape, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * 2.0).to(dtype);
}

void expect_round_trip(const Vae& vae, const at::Tensor& z, double tol) {
  const at::Tensor back = vae.normalize(vae.denormalize(z));
  EXPECT_EQ(back.scalar_type(), z.scalar_type());
  EXPECT_TRUE(at::allclose(back.to(at::kFloat), z.to(at::kFloat), tol, tol)) << vae.info().cls;
  const at::Tensor there = vae.denormalize(vae.normalize(z));
  EXPECT_TRUE(at::allclose(there.to(at::kFloat), z.to(at::kFloat), tol, tol)) << vae.info().cls;
}

TEST(VaeInterface, AutoencoderKLDenormalizeIsFluxPipelinesArithmetic) {
  const VaeFolder f = vae_folder("flux");
  const auto vae = load_vae(f, decoder_options("bf16", {}));
  const auto& kl = dynamic_cast<const AutoencoderKL&>(*vae);
  const VaeConfig& cfg = kl.config();
  ASSERT_NE(cfg.scaling_factor, 1.0);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor z = random_z({2, cfg.latent_channels, 6, 4}, dtype, 7);
    // flux_pipeline.cpp's flux_decoder, in the pipeline's dtype.
    const at::Tensor old = z / cfg.scaling_factor + cfg.shift_factor;
    const at::Tensor mine = kl.denormalize(z);
    EXPECT_EQ(mine.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(mine, old)) << dtype;
    EXPECT_TRUE(at::equal(kl.normalize(z), (z - cfg.shift_factor) * cfg.scaling_factor)) << dtype;
    expect_round_trip(kl, z, dtype == at::kFloat ? 1e-5 : 5e-2);
  }
  EXPECT_THROW(kl.denormalize(at::zeros({1, cfg.latent_channels + 1, 2, 2})), RequestError);
}

TEST(VaeInterface, AutoencoderKLFlux2DenormalizeIsFlux2PipelinesArithmetic) {
  const VaeFolder f = vae_folder("flux2-klein");
  for (const std::string vae_dtype : {"fp32", "bf16"}) {
    ModelOptions o = decoder_options(vae_dtype, {});
    auto cfg_json = f.config;
    cfg_json["force_upcast"] = false;  // bf16 statistics too
    auto source = checkpoint::open_weight_source(f.dir);
    const auto kl = AutoencoderKL::load(*source, cfg_json, f.config_path, {}, o);
    const int64_t c4 = 4 * kl->config().latent_channels;
    // The statistics are not trivial (init-model draws them around 1).
    EXPECT_FALSE(at::equal(kl->latent_bn_mean(), at::zeros_like(kl->latent_bn_mean())));
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor z = random_z({2, c4, 3, 5}, dtype, 11);
      // flux2_pipeline.cpp's flux2_decoder.
      const at::Tensor old = z * kl->latent_bn_std().to(z.scalar_type()).view({1, -1, 1, 1}) +
                             kl->latent_bn_mean().to(z.scalar_type()).view({1, -1, 1, 1});
      const at::Tensor mine = kl->denormalize(z);
      EXPECT_EQ(mine.scalar_type(), dtype);
      EXPECT_TRUE(at::equal(mine, old)) << vae_dtype << " " << dtype;
      // Flux2Pipeline's encode side: (z - mean) / std.
      const at::Tensor enc = (z - kl->latent_bn_mean().to(dtype).view({1, -1, 1, 1})) /
                             kl->latent_bn_std().to(dtype).view({1, -1, 1, 1});
      EXPECT_TRUE(at::equal(kl->normalize(z), enc)) << vae_dtype << " " << dtype;
      expect_round_trip(*kl, z, dtype == at::kFloat ? 1e-5 : 8e-2);
    }
    // Not the patchified layout.
    EXPECT_THROW(kl->denormalize(at::zeros({1, c4 / 4, 4, 4})), RequestError);
  }
}

TEST(VaeInterface, QwenImageDenormalizeIsQwenImagePipelinesArithmetic) {
  const VaeFolder f = vae_folder("qwen-image");
  const auto vae = load_vae(f, decoder_options("fp32", {}));
  const auto& q = dynamic_cast<const QwenImageVae&>(*vae);
  const QwenImageVaeConfig& cfg = q.config();
  const int64_t c = cfg.z_dim;
  for (at::ScalarType vdt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor z = random_z({2, c, 1, 4, 6}, vdt, 13);
    // qwen_image_pipeline.cpp's qwen_image_decoder (z already in the VAE's dtype vdt).
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor mean = at::tensor(cfg.latents_mean, f32.dtype(at::kDouble)).to(at::kFloat).view({1, c, 1, 1, 1});
    const at::Tensor std = at::tensor(cfg.latents_std, f32.dtype(at::kDouble)).to(at::kFloat).view({1, c, 1, 1, 1});
    const at::Tensor inv_std = 1.0 / std.to(z.device(), vdt);
    const at::Tensor old = z / inv_std + mean.to(z.device(), vdt);
    const at::Tensor mine = q.denormalize(z);
    EXPECT_EQ(mine.scalar_type(), vdt);
    EXPECT_TRUE(at::equal(mine, old)) << vdt;
    // QwenImageImg2ImgPipeline's encode side: (z - mean) * (1 / std).
    EXPECT_TRUE(at::equal(q.normalize(z), (z - mean.to(vdt)) * inv_std)) << vdt;
    expect_round_trip(q, z, vdt == at::kFloat ? 1e-5 : 8e-2);
  }
  EXPECT_THROW(q.denormalize(at::zeros({1, c, 4, 4})), RequestError);  // 4-D: not this VAE's layout
}

TEST(VaeInterface, SharedPartsAndSwitches) {
  for (const std::string arch : {"flux", "qwen-image"}) {
    SCOPED_TRACE(arch);
    const VaeFolder f = vae_folder(arch);
    memory::MemoryOptions mem;
    mem.vae_slicing = true;
    mem.vae_tiling = true;
    mem.vae_tile_overlap = 0.5;
    ModelOptions enc = decoder_options("fp32", mem);
    enc.part = "encoder";
    const auto model = load_vae(f, enc);
    const auto* vae = dynamic_cast<const Vae*>(model.get());
    ASSERT_NE(vae, nullptr);
    EXPECT_TRUE(vae->has_encoder());
    EXPECT_FALSE(vae->has_decoder());
    EXPECT_TRUE(vae->slicing());
    EXPECT_TRUE(vae->tiling());
    EXPECT_EQ(vae->tile_sample_size(), vae->info().default_tile_sample);
    EXPECT_EQ(vae->tile_overlap(), 0.5);
    EXPECT_EQ(vae->primary_output(), "mean");
    try {
      vae->decode(at::zeros({1, vae->latent_channels(), 2, 2}));
      ADD_FAILURE() << "decoded without a decoder";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("loaded without its decoder"), std::string::npos) << e.what();
    }
    EXPECT_THROW(vae->forward({}), RequestError);
    // The encoder-only table leaves the decoder's tensors optional; a full one does not.
    const auto enc_table = model_table_for(f.config, f.config_path, enc);
    ASSERT_TRUE(enc_table);
    int64_t optional = 0;
    for (const auto& t : enc_table->tensors) {
      if (t.name.rfind("decoder.", 0) == 0 || t.name.rfind("post_quant_conv.", 0) == 0) {
        EXPECT_TRUE(t.optional) << t.name;
        ++optional;
      }
    }
    EXPECT_GT(optional, 0);
    const auto full_table = model_table_for(f.config, f.config_path, {});
    ASSERT_TRUE(full_table);
    for (const auto& t : full_table->tensors) {
      if (t.name.rfind("decoder.conv_in", 0) == 0) EXPECT_FALSE(t.optional) << t.name;
    }
    ModelOptions bad;
    bad.part = "middle";
    EXPECT_THROW(load_vae(f, bad), ConfigError);
  }
}

}  // namespace
}  // namespace tprun::models
