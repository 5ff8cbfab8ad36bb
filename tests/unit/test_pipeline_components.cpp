// Every registered pipeline class has a complete spec (pipelines/pipeline_spec.h):
// a pipeline added without one fails here, not silently at a user's folder. And a
// QwenImagePipeline folder is checked like the FLUX ones; model_index.json's _class_name
// and an existing model_index.json are never reported as something else.
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <tuple>
#include <vector>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "pipelines/pipeline.h"
#include "pipelines/component_check.h"
#include "pipelines/pipeline_spec.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(PipelineComponents, EveryRegisteredPipelineHasATable) {
  const auto names = pipeline_names();
  ASSERT_GE(names.size(), 4u);
  for (const auto& cls : names) {
    const PipelineSpec* spec = find_pipeline_spec(cls);
    ASSERT_NE(spec, nullptr) << cls;
    EXPECT_EQ(spec->cls, cls);
    EXPECT_TRUE(spec->load && spec->tokenize && spec->request_options && spec->shapes) << cls << ": incomplete spec";
    // One required transformer named "transformer" (a second expert optional: Wan 2.2's
    // transformer_2) and one VAE, each component named once, every model component with accepted classes.
    int transformers = 0, vaes = 0;
    std::set<std::string> seen;
    for (const auto& c : spec->components) {
      EXPECT_TRUE(seen.insert(c.name).second) << cls << " names " << c.name << " twice";
      EXPECT_FALSE(c.classes.empty()) << cls << "." << c.name;
      transformers += c.role == ComponentRole::kTransformer && c.required;
      if (c.role == ComponentRole::kTransformer && !c.required) EXPECT_TRUE(c.staged_expert) << cls << "." << c.name;
      vaes += c.role == ComponentRole::kVae;
      if (c.splittable) EXPECT_EQ(c.role, ComponentRole::kTextEncoder) << cls << "." << c.name;
    }
    EXPECT_EQ(transformers, 1) << cls;
    ASSERT_NE(spec->find("transformer"), nullptr) << cls;
    EXPECT_TRUE(spec->find("transformer")->required) << cls;
    EXPECT_EQ(vaes, 1) << cls;
    EXPECT_NE(spec->find("scheduler"), nullptr) << cls;
  }
}

void write(const fs::path& p, const json& j) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << j.dump();
}

json qwen_index() {
  return {{"_class_name", "QwenImagePipeline"},
          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
          {"text_encoder", {"transformers", "Qwen2_5_VLForConditionalGeneration"}},
          {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
          {"transformer", {"diffusers", "QwenImageTransformer2DModel"}},
          {"vae", {"diffusers", "AutoencoderKLQwenImage"}}};
}

void make_qwen(const fs::path& root, const json& index, const json& encoder_architectures) {
  write(root / "model_index.json", index);
  write(root / "scheduler" / "scheduler_config.json", {{"_class_name", "FlowMatchEulerDiscreteScheduler"}});
  write(root / "text_encoder" / "config.json", {{"architectures", encoder_architectures}});
  write(root / "tokenizer" / "tokenizer_config.json", json::object());
  write(root / "transformer" / "config.json", {{"_class_name", "QwenImageTransformer2DModel"}});
  write(root / "vae" / "config.json", {{"_class_name", "AutoencoderKLQwenImage"}});
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

TEST(PipelineComponents, QwenImageFolderIsChecked) {
  test::TempDir tmp;
  int n = 0;
  auto with = [&](const json& index, const json& arch = json::array({"Qwen2_5_VLForConditionalGeneration"})) {
    const fs::path d = tmp.path() / std::to_string(n++);
    make_qwen(d, index, arch);
    return error_of(d);
  };
  EXPECT_EQ(with(qwen_index()), "");
  for (const auto& [comp, lib, cls] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"transformer", "diffusers", "FluxTransformer2DModel"},
           {"transformer", "diffusers", "EvilModel"},
           {"vae", "diffusers", "AutoencoderKLWan"},
           {"text_encoder", "transformers", "T5EncoderModel"},
           {"text_encoder", "transformers", "Qwen3ForCausalLM"},
           {"scheduler", "diffusers", "DDIMScheduler"}}) {
    json j = qwen_index();
    j[comp] = {lib, cls};
    const std::string e = with(j);
    EXPECT_NE(e.find("model_index.json: " + comp + " is"), std::string::npos) << cls << ": " << e;
    EXPECT_NE(e.find(cls), std::string::npos) << e;
  }
  EXPECT_NE(with(qwen_index(), json::array({"Qwen3ForCausalLM"})).find("architectures[0] 'Qwen3ForCausalLM'"),
            std::string::npos);
  EXPECT_NE(with(qwen_index(), json::array()).find("architectures must be a list of class names (found [])"),
            std::string::npos);
  EXPECT_NE(with(qwen_index(), "Qwen2_5_VLForConditionalGeneration").find("architectures must be a list"),
            std::string::npos);
}

TEST(PipelineComponents, ModelIndexClassNameIsNamed) {
  test::TempDir tmp;
  int n = 0;
  auto message = [&](const json& index) -> std::string {
    const fs::path d = tmp.path() / std::to_string(n++);
    write(d / "model_index.json", index);
    try {
      checkpoint::open_pipeline_folder(d.string());
    } catch (const CheckpointError& e) {
      EXPECT_TRUE(e.all_ranks());
      return e.what();
    }
    return "";
  };
  json j = qwen_index();
  j["_class_name"] = 5;
  EXPECT_NE(message(j).find("model_index.json: _class_name is not a string (found 5)"), std::string::npos);
  j["_class_name"] = "";
  EXPECT_NE(message(j).find("model_index.json: _class_name is empty"), std::string::npos);
  j.erase("_class_name");
  EXPECT_NE(message(j).find("model_index.json: _class_name is missing"), std::string::npos);
}

TEST(PipelineComponents, ModelIndexThatExistsIsNeverMissing) {
  test::TempDir tmp;
  EXPECT_FALSE(checkpoint::is_pipeline_folder((tmp.path() / "none").string()));
  EXPECT_FALSE(checkpoint::is_pipeline_folder((tmp.path() / "file-not-folder").string() + "/x"));
  // A symlink loop: stat fails with ELOOP, which is said as it is, not "no model_index.json".
  fs::create_directories(tmp.path() / "loop");
  fs::create_symlink("model_index.json", tmp.path() / "loop" / "model_index.json");
  try {
    checkpoint::is_pipeline_folder((tmp.path() / "loop").string());
    ADD_FAILURE() << "a model_index.json symlink loop was taken for a missing file";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic links"), std::string::npos) << e.what();
  }
  fs::create_directories(tmp.path() / "dir" / "model_index.json");
  EXPECT_THROW(checkpoint::is_pipeline_folder((tmp.path() / "dir").string()), CheckpointError);
}

}  // namespace
}  // namespace tprun::pipelines
