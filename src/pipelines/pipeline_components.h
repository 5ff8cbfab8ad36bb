#pragma once
// What each pipeline class accepts in its folder, checked before any weight
// byte is read: the components model_index.json may name, the (library,
// class) each may be, and the class each component's own config names
// (diffusers' "_class_name" in config.json / scheduler_config.json,
// transformers' "architectures"[0] in a text encoder's config.json).
//
//   FluxPipeline        transformer FluxTransformer2DModel, vae AutoencoderKL,
//                       text_encoder CLIPTextModel, text_encoder_2 T5EncoderModel,
//                       tokenizer CLIPTokenizer[Fast], tokenizer_2 T5Tokenizer[Fast],
//                       scheduler FlowMatchEulerDiscreteScheduler; image_encoder
//                       CLIPVisionModelWithProjection and feature_extractor
//                       CLIPImageProcessor (optional, not used)
//   Flux2KleinPipeline transformer Flux2Transformer2DModel, vae AutoencoderKLFlux2,
//                       text_encoder Qwen3ForCausalLM, tokenizer Qwen2Tokenizer[Fast],
//                       scheduler FlowMatchEulerDiscreteScheduler
//   Flux2Pipeline       as klein, with text_encoder Mistral3ForConditionalGeneration
//                       and tokenizer PixtralProcessor (or AutoProcessor)
//   QwenImagePipeline   transformer QwenImageTransformer2DModel, vae
//                       AutoencoderKLQwenImage, text_encoder
//                       Qwen2_5_VLForConditionalGeneration, tokenizer
//                       Qwen2Tokenizer[Fast], scheduler FlowMatchEulerDiscreteScheduler
//
// A component the pipeline does not have, a class it does not accept, or a
// config class that is not a string or not accepted is one CheckpointError
// naming the file and the field (every rank reads the same files, so every
// rank raises it). Missing required components are left to the pipeline's
// loader, which names them.

#include <cstdint>
#include <string>

namespace tprun::checkpoint {
struct PipelineFolder;
}
namespace tprun::memory {
struct MemoryOptions;
}

namespace tprun::pipelines {

// Checks `pf` against what its _class_name's pipeline accepts. Every
// registered pipeline class has a table (the unit test PipelineComponents.
// EveryRegisteredPipelineHasATable walks the registry); a class without one
// is an internal error here, never a folder that goes unchecked.
void check_pipeline_components(const checkpoint::PipelineFolder& pf);

// Whether `pipeline` (a model_index.json _class_name) has a component table.
bool has_component_spec(const std::string& pipeline);

// [memory] vae_tiling's tiles against the VAE (its scale factor, and its
// config's sample_size when vae_tile_sample_size is unset), in pixels, as
// models/vae_tiling.h will cut them: the tile a multiple of the scale factor
// and its stride (tile x (1 - overlap)) at least one latent pixel. ConfigError
// (every rank) naming the key, before any weight is read; nothing when tiling
// is off.
void check_vae_tiles(const memory::MemoryOptions& memory, int64_t scale_factor, int64_t sample_size,
                     const std::string& vae_config);

}  // namespace tprun::pipelines
