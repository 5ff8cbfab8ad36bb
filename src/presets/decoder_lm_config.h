#pragma once
// The config.json keys the decoder-only language models of the text encoders
// share, as transformers writes them: Qwen3 (FLUX.2 [klein]), Mistral's
// text_config (FLUX.2 [dev]) and Qwen2.5-VL's flat layout (Qwen-Image). A
// family's presets file adds the keys that are its model's own.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tprun::presets {

struct DecoderLm {
  std::string model_type;  // "qwen3"
  int64_t hidden_size = 0, intermediate_size = 0, num_attention_heads = 0, num_key_value_heads = 0,
          num_hidden_layers = 0, vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 0;
};

// `lm`'s keys with attention_dropout 0, hidden_act silu, initializer_range
// 0.02, untied word embeddings and use_cache true, then `own` over them.
nlohmann::json decoder_lm_config(const DecoderLm& lm, const nlohmann::json& own);

}  // namespace tprun::presets
