#pragma once
// The config.json keys the T5 v1.1 family of text encoders share, as
// transformers writes them: FLUX.1's T5EncoderModel (text_encoder_2/) and
// Wan's UMT5EncoderModel (text_encoder/). A family's presets file adds the
// keys that are its model's own.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tprun::presets {

struct T5Encoder {
  std::string model_type;  // "t5", "umt5"
  int64_t d_model = 0, d_ff = 0, d_kv = 0, num_heads = 0, num_layers = 0, vocab_size = 0;
};

// `t5`'s keys (num_decoder_layers = num_layers) with the gated-gelu feed
// forward (dense_act_fn gelu_new), dropout_rate 0.1, classifier_dropout 0,
// layer_norm_epsilon 1e-6, 32 relative-attention buckets over a distance of
// 128, eos 1, pad 0, decoder start 0, dtype float32, then `own` over them.
nlohmann::json t5_encoder_config(const T5Encoder& t5, const nlohmann::json& own);

}  // namespace tprun::presets
