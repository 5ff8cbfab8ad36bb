#pragma once
// QwenImagePipeline's constants and __call__ defaults (diffusers 0.40.0,
// pipelines/qwenimage/pipeline_qwenimage.py), shared by the pipeline, its
// prompt encoding and its fit-planner layout:
//   prompt template   a fixed system message and the user's prompt in Qwen's
//                     chat markup (not the tokenizer's chat template); the
//                     first 34 tokens (the system part and "<|im_start|>user\n")
//                     are dropped from the encoder's output
//   tokenizer limit   1024 + 34 tokens (truncated, never padded for one prompt)
//   max_sequence_length  default 512, at most 1024 (diffusers refuses more)
// The __call__ defaults (1024 x 1024, 50 steps, true_cfg_scale 4.0, no
// guidance) are in the pipeline's spec (qwen_image_pipeline.cpp).

#include <cstdint>
#include <string>

namespace tprun::pipelines {

constexpr const char* kQwenImagePipelineClass = "QwenImagePipeline";
// Tokens of the template before the prompt that the pipeline drops.
constexpr int64_t kQwenImageDropTokens = 34;
// The tokenizer's max_length is this plus kQwenImageDropTokens.
constexpr int64_t kQwenImageTokenizerMax = 1024;
constexpr int64_t kQwenImageMaxSequenceLimit = 1024;

// The templated text the tokenizer sees for `prompt`.
std::string qwen_image_prompt_text(const std::string& prompt);

}  // namespace tprun::pipelines
