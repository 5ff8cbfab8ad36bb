// QwenImagePipeline's text conditioning: the template's tokens dropped and
// max_sequence_length applied to one prompt's encoder output; a batch's
// embeddings padded to the longest with the mask the transformer gets (none
// when every token is real, as diffusers passes None); the prompt template.

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "pipelines/pipeline_spec.h"
#include "pipelines/qwen_image_defaults.h"
#include "pipelines/qwen_image_text.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

TEST(QwenImageText, KeepsTheTokensAfterTheTemplateUpToTheLimit) {
  const at::Tensor h = at::arange(50 * 3, at::kFloat).view({1, 50, 3});
  const at::Tensor all = qwen_image_keep_tokens(h, 34, 512);
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{1, 16, 3}));
  EXPECT_TRUE(at::equal(all, h.slice(1, 34, 50)));
  const at::Tensor cut = qwen_image_keep_tokens(h, 34, 5);
  ASSERT_EQ(cut.sizes(), (std::vector<int64_t>{1, 5, 3}));
  EXPECT_TRUE(at::equal(cut, h.slice(1, 34, 39)));
  EXPECT_THROW(qwen_image_keep_tokens(h.slice(1, 0, 34), 34, 512), RequestError);
}

TEST(QwenImageText, PadsToTheLongestWithAMask) {
  const at::Tensor a = at::randn({1, 3, 4}), b = at::randn({1, 5, 4});
  const TextBatch t = pad_text_batch({a, b}, {at::Tensor(), at::Tensor()}, "prompt_embeds");
  ASSERT_EQ(t.embeds.sizes(), (std::vector<int64_t>{2, 5, 4}));
  EXPECT_TRUE(at::equal(t.embeds[0].slice(0, 0, 3), a[0]));
  EXPECT_TRUE(at::equal(t.embeds[0].slice(0, 3, 5), at::zeros({2, 4})));
  EXPECT_TRUE(at::equal(t.embeds[1], b[0]));
  ASSERT_TRUE(t.mask.defined());
  EXPECT_EQ(t.mask.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(t.mask, at::tensor(std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1, 1, 1, 1}).view({2, 5})));
}

TEST(QwenImageText, NoMaskWhenEveryTokenIsReal) {
  const at::Tensor a = at::randn({1, 4, 2}), b = at::randn({1, 4, 2});
  const TextBatch t = pad_text_batch({a, b}, {at::Tensor(), at::ones({1, 4}, at::kLong)}, "prompt_embeds");
  EXPECT_FALSE(t.mask.defined());
  EXPECT_TRUE(at::equal(t.embeds, at::cat({a, b}, 0)));
}

TEST(QwenImageText, AGivenMaskIsKeptAndPadded) {
  const at::Tensor a = at::randn({1, 4, 2}), b = at::randn({1, 2, 2});
  const at::Tensor ma = at::tensor(std::vector<int64_t>{1, 1, 1, 0}).view({1, 4});
  const TextBatch t = pad_text_batch({a, b}, {ma, at::Tensor()}, "prompt_embeds");
  EXPECT_TRUE(at::equal(t.mask, at::tensor(std::vector<int64_t>{1, 1, 1, 0, 1, 1, 0, 0}).view({2, 4})));
}

TEST(QwenImageText, RefusesMismatchedShapes) {
  EXPECT_THROW(pad_text_batch({at::randn({1, 3, 4}), at::randn({1, 3, 5})}, {at::Tensor(), at::Tensor()}, "x"),
               RequestError);
  EXPECT_THROW(pad_text_batch({at::randn({1, 3, 4})}, {at::ones({1, 2}, at::kLong)}, "x"), RequestError);
}

TEST(QwenImageText, PromptTemplate) {
  const std::string t = qwen_image_prompt_text("a cat");
  EXPECT_EQ(t.rfind("<|im_start|>system\nDescribe the image by detailing the color,", 0), 0u);
  EXPECT_NE(t.find("<|im_end|>\n<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"), std::string::npos);
  const PipelineSpec* spec = find_pipeline_spec("QwenImagePipeline");
  ASSERT_NE(spec, nullptr);
  const GenerationRequest d = spec->defaults.request(8);
  EXPECT_EQ(*d.height, 1024);
  EXPECT_EQ(*d.steps, 50);
  EXPECT_EQ(*d.true_cfg_scale, 4.0);
  EXPECT_EQ(*d.max_sequence_length, 512);
  EXPECT_FALSE(d.guidance.has_value());
}

}  // namespace
}  // namespace tprun::pipelines
