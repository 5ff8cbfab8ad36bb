#include "presets/t5_encoder_config.h"

namespace tprun::presets {

nlohmann::json t5_encoder_config(const T5Encoder& t5, const nlohmann::json& own) {
  nlohmann::json config = {{"classifier_dropout", 0.0},
                           {"d_ff", t5.d_ff},
                           {"d_kv", t5.d_kv},
                           {"d_model", t5.d_model},
                           {"decoder_start_token_id", 0},
                           {"dense_act_fn", "gelu_new"},
                           {"dropout_rate", 0.1},
                           {"dtype", "float32"},
                           {"eos_token_id", 1},
                           {"feed_forward_proj", "gated-gelu"},
                           {"initializer_factor", 1.0},
                           {"is_gated_act", true},
                           {"layer_norm_epsilon", 1e-06},
                           {"model_type", t5.model_type},
                           {"num_decoder_layers", t5.num_layers},
                           {"num_heads", t5.num_heads},
                           {"num_layers", t5.num_layers},
                           {"pad_token_id", 0},
                           {"relative_attention_max_distance", 128},
                           {"relative_attention_num_buckets", 32},
                           {"vocab_size", t5.vocab_size}};
  config.update(own);
  return config;
}

}  // namespace tprun::presets
