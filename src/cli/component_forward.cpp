#include "cli/component_forward.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "models/autoencoder_kl.h"
#include "models/clip_text_model.h"
#include "models/flux_transformer.h"
#include "models/t5_encoder.h"
#include "runtime/error.h"

namespace tprun::cli {
namespace {

const at::Tensor& input(const models::TensorMap& in, const std::string& name, const std::string& component) {
  auto it = in.find(name);
  if (it == in.end()) {
    throw RequestError(fmt::format("--component {} needs the input '{}'", component, name), true);
  }
  return it->second;
}

}  // namespace

bool is_other_component(const std::string& c) {
  return c == "text_encoder" || c == "text_encoder_2" || c == "vae_decoder" || c == "vae_encoder";
}

std::string component_folder(const std::string& c) {
  return c == "vae_decoder" || c == "vae_encoder" ? std::string("vae") : c;
}

models::TensorMap run_component(const FluxArgs& a, const models::TensorMap& inputs, const parallel::TpContext& tp,
                                const std::string& device, models::Trace* trace, int64_t* reduces) {
  std::string config_path;
  const auto config = models::read_component_config(a.path, &config_path);
  auto source = checkpoint::open_weight_source(a.path, a.variant);
  if (reduces) *reduces = 0;
  models::TensorMap out;
  if (a.component == "text_encoder" || a.component == "text_encoder_2") {
    models::TextEncoderLoadOptions o;
    o.dtype = a.dtype;
    o.device = device;
    const auto& ids = input(inputs, "input_ids", a.component);
    if (a.component == "text_encoder") {
      auto m = models::ClipTextModel::load(*source, config, config_path, o);
      return m.forward(ids, trace);
    }
    auto m = models::T5Encoder::load(*source, config, config_path, tp, o);
    if (reduces) *reduces = m.all_reduces_per_forward();
    out["last_hidden_state"] = m.forward(ids, trace);
    return out;
  }
  if (a.component == "vae_decoder" || a.component == "vae_encoder") {
    models::VaeLoadOptions o;
    o.dtype = a.dtype;
    o.device = device;
    o.decoder = a.component == "vae_decoder";
    o.encoder = !o.decoder;
    auto m = models::AutoencoderKL::load(*source, config, config_path, o);
    if (o.decoder) {
      out["sample"] = m.decode(input(inputs, "latents", a.component), trace);
      return out;
    }
    return m.encode(input(inputs, "image", a.component), trace);
  }
  throw ConfigError(fmt::format("--component {}: not one of transformer, text_encoder, text_encoder_2, vae_decoder, "
                                "vae_encoder",
                                a.component),
                    true);
}

}  // namespace tprun::cli
