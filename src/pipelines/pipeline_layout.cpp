#include "pipelines/pipeline_layout.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/pipeline_folder.h"
#include "models/autoencoder_kl.h"
#include "models/model_config.h"
#include "pipelines/family_steps.h"
#include "pipelines/latents.h"
#include "pipelines/pipeline_components.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

std::map<std::string, LayoutReader>& layouts() {
  static std::map<std::string, LayoutReader> r;
  return r;
}

}  // namespace

namespace detail {
bool register_pipeline_layout(const char* cls, LayoutReader reader) {
  layouts()[cls] = std::move(reader);
  return true;
}
}  // namespace detail

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Encode: return "encode";
    case Phase::Denoise: return "denoise";
    case Phase::Decode: return "decode";
  }
  return "?";
}

const ComponentLayout* PipelineLayout::find(const std::string& component) const {
  for (const auto& c : components)
    if (c.name == component) return &c;
  return nullptr;
}

int64_t PipelineLayout::image_tokens(int64_t height, int64_t width) const {
  return image_seq_len(height, width, vae_scale_factor);
}

ComponentLayout component_layout(const checkpoint::PipelineFolder& pf, const std::string& name, Phase phase,
                                 const PipelineOptions& options) {
  ComponentLayout c;
  c.name = name;
  c.path = need_component(pf, name).path;
  c.phase = phase;
  c.options = component_options(options, name);
  return c;
}

VaeConfigRead add_vae_decoder(const checkpoint::PipelineFolder& pf, const PipelineOptions& options,
                              PipelineLayout& layout) {
  ComponentLayout c = component_layout(pf, "vae", Phase::Decode, options);
  VaeConfigRead read;
  const auto config = models::read_component_config(c.path, &read.path);
  const auto v = models::VaeConfig::from_json(config, read.path);
  read.cls = v.cls;
  check_vae_tiles(options.component_base.memory, v.scale_factor(), v.sample_size, read.path);
  // AutoencoderKL::load: a 16-bit dtype computes in fp32 under force_upcast.
  if (options.dtype != "fp32" && v.force_upcast) c.options.dtype = "fp32";
  c.options.part = "decoder";
  c.rank_zero_only = !options.decode_on_every_rank;
  const auto& channels = v.decoder_block_out_channels.empty() ? v.block_out_channels : v.decoder_block_out_channels;
  VaeShape& s = layout.vae;
  s.decoder_channels.assign(channels.rbegin(), channels.rend());
  s.latent_channels = v.latent_channels;
  s.scale_factor = v.scale_factor();
  s.elem_bytes = c.options.dtype == "fp32" ? 4 : 2;
  const auto& mem = options.component_base.memory;
  s.tiling = mem.vae_tiling;
  s.tile_sample = mem.vae_tile_sample_size > 0 ? mem.vae_tile_sample_size : v.sample_size;
  layout.vae_scale_factor = v.scale_factor();
  if (options.denoiser) layout.components.push_back(std::move(c));
  return read;
}

bool has_pipeline_layout(const std::string& cls) { return layouts().count(cls) > 0; }

PipelineLayout pipeline_layout(const std::string& folder, const PipelineOptions& options) {
  // The refusals load_pipeline gives, in its words.
  if (!checkpoint::is_pipeline_folder(folder)) {
    throw ConfigError(fmt::format("{}: not a diffusers pipeline folder (no model_index.json)", folder), true);
  }
  const auto pf = checkpoint::open_pipeline_folder(folder);
  auto it = layouts().find(pf.cls);
  if (it == layouts().end()) {
    throw ConfigError(fmt::format("{}/model_index.json: _class_name '{}' is not a pipeline tprun can run (known: {})",
                                  folder, pf.cls, fmt::join(pipeline_names(), ", ")),
                      true);
  }
  check_pipeline_components(pf);
  return it->second(pf, options);
}

}  // namespace tprun::pipelines
