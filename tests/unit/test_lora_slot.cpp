// Run-time LoRA in the parallel layers (parallel/lora_slot.h): a layer adds
// sum scale (x A^T) B^T from its slot, every copy of a layer reads the same
// slot, and a cleared slot gives the base layer's output bit for bit.

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/tensor_file.h"
#include "models/model_builder.h"
#include "parallel/lora_slot.h"

namespace fs = std::filesystem;
using namespace tprun;

namespace {

class LoraSlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tprun_lora_slot_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    at::manual_seed(3);
    checkpoint::write_tensor_file_f32((dir_ / "model.safetensors").string(),
                                      {{"up.weight", at::randn({8, 4})}, {"up.bias", at::randn({8})},
                                       {"down.weight", at::randn({4, 8})}, {"down.bias", at::randn({4})}});
    std::ofstream(dir_ / "config.json") << R"({"_class_name": "Toy"})";
    ck_ = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(dir_.string()));
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::shared_ptr<const checkpoint::ComponentCheckpoint> ck_;
};

TEST_F(LoraSlotTest, AddsTheLowRankTermsAndClearsToTheBaseBitForBit) {
  parallel::ParallelLinear up, down;
  auto declare = [&](models::ModelBuilder& b) {
    up = b.linear("up", 8, 4, models::LinearDecl::colwise().with_bias());
    down = b.linear("down", 4, 8, models::LinearDecl::rowwise().with_bias());
  };
  checkpoint::SafetensorsSource source(ck_);
  models::BuiltModel built = models::build_model("Toy", source, {}, {}, declare);
  ASSERT_TRUE(built.lora_targets);
  ASSERT_EQ(built.lora_targets->modules.size(), 2u);
  EXPECT_EQ(built.lora_targets->modules.at("up").slot, up.lora_slot());
  EXPECT_TRUE(built.lora_targets->modules.at("up").weight.kept_as_computed());

  const at::Tensor x = at::randn({3, 4});
  const at::Tensor base_up = up.forward(x);
  const at::Tensor base_down = down.forward(base_up);

  const at::Tensor a1 = at::randn({2, 4}), b1 = at::randn({8, 2});
  const at::Tensor a2 = at::randn({3, 4}), b2 = at::randn({8, 3});
  const at::Tensor a3 = at::randn({2, 8}), b3 = at::randn({4, 2});
  up.lora_slot()->deltas = {{a1, b1, 0.5}, {a2, b2, -1.25}};
  const parallel::ParallelLinear copy = down;  // a copy reads the same slot
  copy.lora_slot()->deltas = {{a3, b3, 2.0}};

  const at::Tensor y = up.forward(x);
  const at::Tensor want = base_up + 0.5 * at::matmul(at::matmul(x, a1.t()), b1.t()) -
                          1.25 * at::matmul(at::matmul(x, a2.t()), b2.t());
  EXPECT_TRUE(at::allclose(y, want, 1e-5, 1e-5));
  const at::Tensor z = down.forward(y);
  const at::Tensor want_z = at::linear(y, down.weight().get(), down.bias().get()) +
                            2.0 * at::matmul(at::matmul(y, a3.t()), b3.t());
  EXPECT_TRUE(at::allclose(z, want_z, 1e-5, 1e-5));

  // Cleared: the base layers, bit for bit (nothing was folded into a weight).
  up.lora_slot()->deltas.clear();
  down.lora_slot()->deltas.clear();
  EXPECT_TRUE(at::equal(up.forward(x), base_up));
  EXPECT_TRUE(at::equal(down.forward(base_up), base_down));
}

}  // namespace
