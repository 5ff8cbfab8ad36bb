// The tensor table of diffusers' AutoencoderKL: every state_dict tensor in
// module order, shapes from config.json, all replicated (the VAE has no TP
// plan). Module order: encoder (conv_in, down_blocks, mid_block,
// conv_norm_out, conv_out), decoder (conv_in, up_blocks, mid_block, ...),
// quant_conv, post_quant_conv (each only when its use_* flag is true).

#include <fmt/format.h>

#include "models/autoencoder_kl.h"
#include "models/model_table.h"

namespace tprun::models {

namespace {

class TableWriter {
 public:
  explicit TableWriter(ModelTable& t) : t_(t) {}

  void add(const std::string& name, std::vector<int64_t> shape) {
    TensorSpec s;
    s.name = name;
    s.shape = std::move(shape);
    t_.tensors.push_back(std::move(s));
  }
  void conv(const std::string& p, int64_t out, int64_t in, int64_t k) {
    add(p + ".weight", {out, in, k, k});
    add(p + ".bias", {out});
  }
  void norm(const std::string& p, int64_t ch) {
    add(p + ".weight", {ch});
    add(p + ".bias", {ch});
  }
  void linear(const std::string& p, int64_t out, int64_t in) {
    add(p + ".weight", {out, in});
    add(p + ".bias", {out});
  }
  // ResnetBlock2D: norm1, conv1, norm2, conv2, conv_shortcut (in != out).
  void resnet(const std::string& p, int64_t in, int64_t out) {
    norm(p + ".norm1", in);
    conv(p + ".conv1", out, in, 3);
    norm(p + ".norm2", out);
    conv(p + ".conv2", out, out, 3);
    if (in != out) conv(p + ".conv_shortcut", out, in, 1);
  }
  // UNetMidBlock2D: attentions (group_norm, to_q, to_k, to_v, to_out.0), resnets.
  void mid_block(const std::string& p, int64_t ch, bool attention) {
    if (attention) {
      const std::string a = p + ".attentions.0";
      norm(a + ".group_norm", ch);
      for (const char* n : {".to_q", ".to_k", ".to_v", ".to_out.0"}) linear(a + n, ch, ch);
    }
    resnet(p + ".resnets.0", ch, ch);
    resnet(p + ".resnets.1", ch, ch);
  }

 private:
  ModelTable& t_;
};

ModelTable build_vae_table(const nlohmann::json& c, const std::string& path, const TableOptions&) {
  const VaeConfig cfg = VaeConfig::from_json(c, path);
  ModelTable t;
  t.cls = "AutoencoderKL";
  TableWriter w(t);
  const auto& ch = cfg.block_out_channels;
  const size_t n = ch.size();

  // Encoder (double_z: conv_out gives mean and logvar).
  w.conv("encoder.conv_in", ch[0], cfg.in_channels, 3);
  int64_t in = ch[0];
  for (size_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < cfg.layers_per_block; ++j)
      w.resnet(fmt::format("encoder.down_blocks.{}.resnets.{}", i, j), j == 0 ? in : ch[i], ch[i]);
    if (i + 1 < n) w.conv(fmt::format("encoder.down_blocks.{}.downsamplers.0.conv", i), ch[i], ch[i], 3);
    in = ch[i];
  }
  w.mid_block("encoder.mid_block", ch[n - 1], cfg.mid_block_add_attention);
  w.norm("encoder.conv_norm_out", ch[n - 1]);
  w.conv("encoder.conv_out", 2 * cfg.latent_channels, ch[n - 1], 3);

  // Decoder (up_blocks are registered before mid_block in diffusers' Decoder).
  w.conv("decoder.conv_in", ch[n - 1], cfg.latent_channels, 3);
  in = ch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const int64_t out = ch[n - 1 - i];
    for (int64_t j = 0; j <= cfg.layers_per_block; ++j)
      w.resnet(fmt::format("decoder.up_blocks.{}.resnets.{}", i, j), j == 0 ? in : out, out);
    if (i + 1 < n) w.conv(fmt::format("decoder.up_blocks.{}.upsamplers.0.conv", i), out, out, 3);
    in = out;
  }
  w.mid_block("decoder.mid_block", ch[n - 1], cfg.mid_block_add_attention);
  w.norm("decoder.conv_norm_out", ch[0]);
  w.conv("decoder.conv_out", cfg.out_channels, ch[0], 3);

  if (cfg.use_quant_conv) w.conv("quant_conv", 2 * cfg.latent_channels, 2 * cfg.latent_channels, 1);
  if (cfg.use_post_quant_conv) w.conv("post_quant_conv", cfg.latent_channels, cfg.latent_channels, 1);
  return t;
}

}  // namespace

void register_autoencoder_kl_table() { register_model_table("AutoencoderKL", build_vae_table); }

}  // namespace tprun::models
