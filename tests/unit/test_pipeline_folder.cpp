// Pipeline folders checked against their pipeline's components (checkpoint/pipeline_folder.h,
// pipelines/component_check.h) and VAE tiles checked in pixels.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "memory/memory_options.h"
#include "pipelines/component_check.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void write(const fs::path& p, const json& j) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << j.dump();
}

// A Flux2KleinPipeline folder with configs only (no weights: nothing here reads one).
json klein_index() {
  return {{"_class_name", "Flux2KleinPipeline"},
          {"is_distilled", false},
          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
          {"text_encoder", {"transformers", "Qwen3ForCausalLM"}},
          {"tokenizer", {"transformers", "Qwen2TokenizerFast"}},
          {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
          {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
}

void make_klein(const fs::path& root, const json& index) {
  write(root / "model_index.json", index);
  write(root / "scheduler" / "scheduler_config.json", {{"_class_name", "FlowMatchEulerDiscreteScheduler"}});
  write(root / "text_encoder" / "config.json", {{"architectures", {"Qwen3ForCausalLM"}}});
  write(root / "tokenizer" / "tokenizer_config.json", json::object());
  write(root / "transformer" / "config.json", {{"_class_name", "Flux2Transformer2DModel"}});
  write(root / "vae" / "config.json", {{"_class_name", "AutoencoderKLFlux2"}});
}

std::string error_of(const fs::path& root) {
  try {
    check_pipeline_components(checkpoint::open_pipeline_folder(root.string()));
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(e.all_ranks());
    return e.what();
  }
  return "";
}

TEST(PipelineFolder, AcceptsWhatThePipelineAccepts) {
  test::TempDir tmp;
  make_klein(tmp.path(), klein_index());
  EXPECT_EQ(error_of(tmp.path()), "");
}

TEST(PipelineFolder, RefusesForeignComponentClasses) {
  test::TempDir tmp;
  auto with = [&](const std::string& name, const json& index) {
    const fs::path d = tmp.path() / name;
    make_klein(d, index);
    return error_of(d);
  };
  json j = klein_index();
  j["transformer"] = {"diffusers", "EvilModel"};
  EXPECT_NE(with("evil", j).find("model_index.json: transformer is [\"diffusers\", \"EvilModel\"]"), std::string::npos);
  j = klein_index();
  j["transformer"] = {"diffusers", "FluxTransformer2DModel"};
  EXPECT_NE(with("flux1", j).find("a Flux2KleinPipeline accepts [\"diffusers\", \"Flux2Transformer2DModel\"]"),
            std::string::npos);
  j = klein_index();
  j["vae"] = {"diffusers", "../../etc"};
  EXPECT_NE(with("dots", j).find("class '../../etc' is not a Python class name"), std::string::npos);
  j = klein_index();
  j["../../etc"] = {"diffusers", "AutoencoderKL"};
  EXPECT_NE(with("name", j).find("component name '../../etc' is not a plain folder name"), std::string::npos);
  j = klein_index();
  j["extra"] = {"diffusers", "AutoencoderKL"};
  fs::create_directories(tmp.path() / "extra" / "extra");
  EXPECT_NE(with("extra", j).find("component 'extra' (AutoencoderKL) is not one a Flux2KleinPipeline has"),
            std::string::npos);
}

TEST(PipelineFolder, RefusesForeignConfigClasses) {
  test::TempDir tmp;
  make_klein(tmp.path(), klein_index());
  const fs::path cfg = tmp.path() / "transformer" / "config.json";
  write(cfg, {{"_class_name", "EvilModel"}});
  EXPECT_NE(error_of(tmp.path()).find(cfg.string() + ": _class_name 'EvilModel' is not a class a Flux2KleinPipeline"),
            std::string::npos)
      << error_of(tmp.path());
  write(cfg, {{"_class_name", 5}});
  EXPECT_NE(error_of(tmp.path()).find(cfg.string() + ": _class_name is not a string (found 5)"), std::string::npos)
      << error_of(tmp.path());
  write(cfg, {{"_class_name", "Flux2Transformer2DModel"}});
  write(tmp.path() / "text_encoder" / "config.json", {{"architectures", {"Mistral3ForConditionalGeneration"}}});
  EXPECT_NE(error_of(tmp.path()).find("architectures[0] 'Mistral3ForConditionalGeneration' is not a class"),
            std::string::npos)
      << error_of(tmp.path());
  write(tmp.path() / "text_encoder" / "config.json", {{"architectures", {"Qwen3ForCausalLM"}}});
  write(tmp.path() / "scheduler" / "scheduler_config.json", {{"_class_name", "EvilScheduler"}});
  EXPECT_NE(error_of(tmp.path()).find("scheduler_config.json: _class_name 'EvilScheduler'"), std::string::npos)
      << error_of(tmp.path());
}

std::string tile_error(int64_t tile, double overlap, int64_t sample_size = 1024) {
  memory::MemoryOptions m;
  m.vae_tiling = true;
  m.vae_tile_sample_size = tile;
  m.vae_tile_overlap = overlap;
  try {
    check_vae_tiles(m, 8, sample_size, "vae/config.json");
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.all_ranks());
    return e.what();
  }
  return "";
}

TEST(PipelineFolder, VaeTilesInPixels) {
  EXPECT_EQ(tile_error(16, 0.25), "");
  EXPECT_EQ(tile_error(512, 0.75), "");
  EXPECT_EQ(tile_error(0, 0.25), "");  // the VAE's sample_size
  EXPECT_NE(tile_error(8, 0.25).find("vae_tile_sample_size = 8 px with vae_tile_overlap = 0.25: a tile advances by 6 px"),
            std::string::npos)
      << tile_error(8, 0.25);
  EXPECT_NE(tile_error(8, 0.25).find("at least 16 px"), std::string::npos);
  EXPECT_NE(tile_error(16, 0.75).find("at least 32 px"), std::string::npos) << tile_error(16, 0.75);
  EXPECT_NE(tile_error(12, 0.25).find("12 px is not a multiple of the VAE's scale factor, 8 px"), std::string::npos);
  EXPECT_NE(tile_error(0, 0.25, 8).find("the VAE's sample_size 8 px (vae/config.json; set vae_tile_sample_size)"),
            std::string::npos)
      << tile_error(0, 0.25, 8);
  memory::MemoryOptions off;
  off.vae_tile_sample_size = 8;  // tiling off: nothing to check
  EXPECT_NO_THROW(check_vae_tiles(off, 8, 1024, "vae/config.json"));
}

}  // namespace
}  // namespace tprun::pipelines
