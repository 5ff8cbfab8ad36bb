#include "pipelines/qwen_image_defaults.h"

namespace tprun::pipelines {

std::string qwen_image_prompt_text(const std::string& prompt) {
  // The system message QwenImagePipeline hard-codes (prompt_template_encode).
  static const std::string head =
      "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
      "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
  static const std::string tail = "<|im_end|>\n<|im_start|>assistant\n";
  return head + prompt + tail;
}

}  // namespace tprun::pipelines
