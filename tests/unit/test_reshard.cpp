// `tprun shard`'s core: re-sharding keeps every tensor's bytes, names files as
// diffusers does, and refuses to clobber.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/shard_loader.h"
#include "runtime/error.h"
#include "runtime/size_string.h"
#include "test_data.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;

fs::path ref_model() { return test::data_dir("flux_transformer") / "model"; }

fs::path fresh_dir(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / fmt::format("tprun-reshard-{}-{}", ::getpid(), tag);
  fs::remove_all(p);
  return p;
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  auto ca = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(a.string()));
  auto cb = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(b.string()));
  ASSERT_EQ(ca->tensor_names(), cb->tensor_names());
  SafetensorsSource sa(ca), sb(cb);
  ShardLoader la(sa, {}), lb(sb, {});
  for (const auto& n : ca->tensor_names()) EXPECT_TRUE(at::equal(la.load(n, {}), lb.load(n, {}))) << n;
}

TEST(Reshard, SplitsLikeDiffusersAndKeepsEveryByte) {
  ASSERT_TRUE(fs::exists(ref_model())) << "committed reference data missing: " << ref_model();
  const fs::path out = fresh_dir("many");
  ReshardOptions o;
  o.max_shard_bytes = parse_size("300KB", "--max-shard-size");
  ReshardSummary s = reshard_component(ref_model().string(), out.string(), o);
  EXPECT_GE(s.shards, 4u);
  for (size_t i = 1; i <= s.shards; ++i) {
    EXPECT_TRUE(fs::exists(out / fmt::format("diffusion_pytorch_model-{:05d}-of-{:05d}.safetensors", i, s.shards)));
  }
  std::ifstream in(out / "diffusion_pytorch_model.safetensors.index.json");
  nlohmann::json idx = nlohmann::json::parse(in);
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), s.bytes);
  EXPECT_EQ(idx["weight_map"].size(), s.tensors);
  EXPECT_TRUE(fs::exists(out / "config.json"));
  auto ck = ComponentCheckpoint::open(out.string());
  for (const auto& f : ck.files()) {
    // A shard may exceed the limit only when it holds a single larger tensor.
    if (f.tensors.size() > 1) EXPECT_LE(f.data_bytes(), o.max_shard_bytes) << f.file;
  }
  expect_same_tensors(ref_model(), out);

  // Back to one file: no index, the unsharded name.
  const fs::path one = fresh_dir("one");
  ReshardSummary s1 = reshard_component(out.string(), one.string(), {});
  EXPECT_EQ(s1.shards, 1u);
  EXPECT_TRUE(fs::exists(one / "diffusion_pytorch_model.safetensors"));
  EXPECT_FALSE(fs::exists(one / "diffusion_pytorch_model.safetensors.index.json"));
  expect_same_tensors(ref_model(), one);

  // Never overwrites without force.
  try {
    reshard_component(ref_model().string(), one.string(), {});
    ADD_FAILURE() << "overwrote a non-empty folder";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos) << e.what();
  }
  ReshardOptions force;
  force.force = true;
  EXPECT_NO_THROW(reshard_component(ref_model().string(), one.string(), force));
  expect_same_tensors(ref_model(), one);
  fs::remove_all(out);
  fs::remove_all(one);
}

TEST(Reshard, VariantNamesAndPipelineRefusal) {
  ASSERT_TRUE(fs::exists(ref_model())) << "committed reference data missing: " << ref_model();
  const fs::path out = fresh_dir("variant");
  ReshardOptions o;
  o.max_shard_bytes = 300000;
  o.variant = "fp16";
  // Source has no fp16 variant: a clear error naming the variant.
  EXPECT_THROW(reshard_component(ref_model().string(), out.string(), o), CheckpointError);
  o.variant.clear();
  reshard_component(ref_model().string(), out.string(), o);
  // Write an fp16-named copy and read it back by variant.
  const fs::path v = fresh_dir("variant2");
  fs::create_directories(v);
  for (const auto& e : fs::directory_iterator(out)) {
    std::string n = e.path().filename().string();
    const std::string from = "diffusion_pytorch_model";
    if (n.rfind(from + "-", 0) == 0) n = from + ".fp16" + n.substr(from.size());
    if (n == from + ".safetensors.index.json") n = from + ".safetensors.index.fp16.json";
    fs::copy_file(e.path(), v / n);
  }
  // The copied index still names the plain shard files: rewrite it as the variant's.
  {
    std::ifstream in(v / "diffusion_pytorch_model.safetensors.index.fp16.json");
    nlohmann::json idx = nlohmann::json::parse(in);
    for (auto& [k, val] : idx["weight_map"].items()) {
      std::string f = val.get<std::string>();
      val = "diffusion_pytorch_model.fp16" + f.substr(std::string("diffusion_pytorch_model").size());
    }
    std::ofstream(v / "diffusion_pytorch_model.safetensors.index.fp16.json") << idx.dump(2);
  }
  auto ck = ComponentCheckpoint::open(v.string(), "fp16");
  EXPECT_EQ(ck.tensor_names().size(), ComponentCheckpoint::open(ref_model().string()).tensor_names().size());
  const fs::path pipe = fresh_dir("pipe");
  fs::create_directories(pipe);
  std::ofstream(pipe / "model_index.json") << R"({"_class_name": "FluxPipeline"})";
  EXPECT_THROW(reshard_component(pipe.string(), (pipe / "x").string(), {}), ConfigError);
  fs::remove_all(out);
  fs::remove_all(v);
  fs::remove_all(pipe);
}

}  // namespace
}  // namespace tprun::checkpoint
