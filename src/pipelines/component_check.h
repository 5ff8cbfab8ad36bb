#pragma once
// A pipeline folder's model_index.json against its class's spec
// (pipeline_spec.h), checked before any weight byte is read: the components
// it may name, the (library, class) each may be, and the class each
// component's own config names (diffusers' "_class_name" in config.json /
// scheduler_config.json, transformers' "architectures"[0] in a text
// encoder's config.json). The families' specs list what diffusers' pipeline
// __init__ signatures accept (pipeline_flux.py, pipeline_flux2.py,
// pipeline_flux2_klein.py, pipeline_qwenimage.py).
//
// A component the pipeline does not have, a class it does not accept, or a
// config class that is not a string or not accepted is one CheckpointError
// naming the file and the field (every rank reads the same files, so every
// rank raises it). Missing required components are named where a load needs
// them (need_component).

#include <cstdint>
#include <string>

namespace tprun::checkpoint {
struct PipelineFolder;
}
namespace tprun::memory {
struct MemoryOptions;
}

namespace tprun::pipelines {

// Checks `pf` against its _class_name's spec. Every registered pipeline
// class has one (the unit test PipelineComponents.
// EveryRegisteredPipelineHasATable walks the registry); a class without one
// is an internal error here, never a folder that goes unchecked.
void check_pipeline_components(const checkpoint::PipelineFolder& pf);


// [memory] vae_tiling's tiles against the VAE (its scale factor, and its
// config's sample_size when vae_tile_sample_size is unset), in pixels, as
// models/vae_tiling.h will cut them: the tile a multiple of the scale factor
// and its stride (tile x (1 - overlap)) at least one latent pixel. ConfigError
// (every rank) naming the key, before any weight is read; nothing when tiling
// is off.
void check_vae_tiles(const memory::MemoryOptions& memory, int64_t scale_factor, int64_t sample_size,
                     const std::string& vae_config);

}  // namespace tprun::pipelines
