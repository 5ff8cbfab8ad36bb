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
//   defaults          1024 x 1024 (default_sample_size 128 x the VAE's 8),
//                     50 steps, true_cfg_scale 4.0 (used only with a negative
//                     prompt), guidance unset (the pipeline never passes it:
//                     diffusers 0.40.0 builds no guidance embedder)

#include <cstdint>
#include <string>

#include "pipelines/generation_request.h"

namespace tprun::pipelines {

constexpr const char* kQwenImagePipelineClass = "QwenImagePipeline";
// Tokens of the template before the prompt that the pipeline drops.
constexpr int64_t kQwenImageDropTokens = 34;
// The tokenizer's max_length is this plus kQwenImageDropTokens.
constexpr int64_t kQwenImageTokenizerMax = 1024;
constexpr int64_t kQwenImageMaxSequenceLimit = 1024;

// The templated text the tokenizer sees for `prompt`.
std::string qwen_image_prompt_text(const std::string& prompt);

// The request defaults of QwenImagePipeline.__call__ for a VAE scale factor.
// guidance stays unset (see above).
GenerationRequest qwen_image_defaults(int64_t vae_scale_factor);

}  // namespace tprun::pipelines
