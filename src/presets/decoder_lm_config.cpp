#include "presets/decoder_lm_config.h"

namespace tprun::presets {

nlohmann::json decoder_lm_config(const DecoderLm& lm, const nlohmann::json& own) {
  nlohmann::json config = {{"attention_dropout", 0.0},
                           {"hidden_act", "silu"},
                           {"hidden_size", lm.hidden_size},
                           {"initializer_range", 0.02},
                           {"intermediate_size", lm.intermediate_size},
                           {"max_position_embeddings", lm.max_position_embeddings},
                           {"model_type", lm.model_type},
                           {"num_attention_heads", lm.num_attention_heads},
                           {"num_hidden_layers", lm.num_hidden_layers},
                           {"num_key_value_heads", lm.num_key_value_heads},
                           {"rms_norm_eps", lm.rms_norm_eps},
                           {"tie_word_embeddings", false},
                           {"use_cache", true},
                           {"vocab_size", lm.vocab_size}};
  config.update(own);
  return config;
}

}  // namespace tprun::presets
