// The loading and request steps the text-to-image families share (see family_steps.h).
#include "pipelines/family_steps.h"

#include <cmath>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "models/autoencoder_kl.h"
#include "pipelines/batch_stages.h"
#include "runtime/error.h"

namespace tprun::pipelines {

const checkpoint::PipelineComponent& need_component(const checkpoint::PipelineFolder& f, const std::string& name) {
  const auto* c = f.find(name);
  if (!c) {
    throw CheckpointError(fmt::format("{}: model_index.json names no '{}' component (a {} needs it)", f.path, name,
                                      f.cls),
                          true);
  }
  return *c;
}

void PipelineRuntime::init(const std::string& pipeline_folder, const parallel::TpContext& group,
                           const PipelineOptions& options) {
  folder = pipeline_folder;
  dtype_name = options.dtype;
  dtype = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  device = c10::Device(options.device);
  tp = group;
  denoiser = options.denoiser;
  if (!options.denoiser && !options.text_encoders) {
    throw ConfigError(fmt::format("{}: a pipeline loaded with neither its text encoders nor its denoiser "
                                  "(transformer and VAE) would load nothing; turn one of them on",
                                  pipeline_folder),
                      true);
  }
}

void PipelineRuntime::need_denoiser(const char* call) const {
  if (denoiser) return;
  throw Error(Error::Kind::Internal,
              fmt::format("{}: {} needs the transformer and the VAE, but this pipeline was loaded without them "
                          "(the text encoders only, for the encode phase of a staged job)",
                          folder, call));
}

void check_packed_channels(int64_t in_channels, const std::string& transformer_config, int64_t latent_channels,
                           const std::string& vae_config) {
  if (in_channels != 4 * latent_channels) {
    throw CheckpointError(fmt::format("{}: in_channels {} is not 4 x the VAE's latent_channels {} ({})",
                                      transformer_config, in_channels, latent_channels, vae_config),
                          true);
  }
}

std::unique_ptr<models::AutoencoderKL> load_vae_decoder(const checkpoint::PipelineComponent& vae,
                                                        const nlohmann::json& config, const std::string& config_path,
                                                        const PipelineOptions& options, PipelineRuntime& rt) {
  if (!options.decode_on_every_rank && rt.tp.rank != 0) return nullptr;
  auto source = checkpoint::open_weight_source(vae.path, options.variant);
  models::ModelOptions o = component_options(options, "vae");
  o.part = "decoder";
  auto decoder = models::AutoencoderKL::load(*source, config, config_path, {}, o);
  rt.bytes += decoder->bytes_loaded();
  return decoder;
}

void check_steps_and_guidance(const GenerationRequest& r) {
  if (*r.steps < 1) throw RequestError(fmt::format("steps must be at least 1, got {}", *r.steps), true);
  if (*r.steps > 10000) throw RequestError(fmt::format("steps {} is beyond the limit of 10000", *r.steps), true);
  if (r.guidance && !std::isfinite(*r.guidance)) throw RequestError("guidance must be a finite number", true);
}

void check_max_sequence_length(const GenerationRequest& r, const std::string& cls, int64_t limit) {
  if (*r.max_sequence_length < 1 || *r.max_sequence_length > limit) {
    throw RequestError(fmt::format("max_sequence_length must be in [1, {}] ({}'s limit), got {}", limit, cls,
                                   *r.max_sequence_length),
                       true);
  }
}

void check_batch_fits(const Pipeline& pipeline, const std::vector<GenerationRequest>& prepared, MemoryModel model,
                      const PipelineRuntime& rt, const VaeShape* vae) {
  model.tp_size = rt.tp.size;
  model.weights_bytes = rt.bytes;
  fill_runtime(model, rt.device.str(), rt.dtype_name, vae);
  check_batch_memory(model, batch_shape(pipeline, prepared), rt.tp, rt.device.str());
}

void check_batch_fits(const Pipeline& pipeline, const std::vector<GenerationRequest>& prepared, MemoryModel model,
                      const PipelineRuntime& rt, const models::AutoencoderKL* vae) {
  const VaeShape shape = vae ? vae_shape(*vae, rt.device.str()) : VaeShape{};
  check_batch_fits(pipeline, prepared, std::move(model), rt, vae ? &shape : nullptr);
}

at::Tensor batch_latents(const std::vector<GenerationRequest>& prepared, const PipelineRuntime& rt,
                         const LatentDraw& draw) {
  std::vector<at::Tensor> per_request;
  for (const auto& q : prepared) {
    per_request.push_back(q.has_given("latents") ? q.given->at("latents").to(rt.device, rt.dtype) : draw(q));
  }
  return stack_batch(per_request, "latents");
}

std::string prompt_key(const std::string& text, int64_t max_sequence_length) {
  return fmt::format("{}\n{}", max_sequence_length, text);
}

TextEncode text_encode(const std::string& field, const std::string& text, int64_t max_sequence_length,
                       std::vector<std::pair<std::string, std::string>> gives) {
  TextEncode e;
  e.field = field;
  e.text = text;
  e.max_sequence_length = max_sequence_length;
  e.key = prompt_key(text, max_sequence_length);
  e.gives = std::move(gives);
  return e;
}

models::TensorMap embeddings_on_cpu(const models::TensorMap& embeddings) {
  models::TensorMap out;
  for (const auto& [name, t] : embeddings) out[name] = t.cpu().contiguous();
  return out;
}

}  // namespace tprun::pipelines
