#pragma once
// `tprun forward` / `tprun verify` for the components other than the
// transformer: the CLIP text model (text_encoder), the T5 encoder
// (text_encoder_2, tensor-parallel with its plan) and the VAE (vae_decoder,
// vae_encoder: both read the pipeline's vae/ folder). Inputs and outputs are
// named as in shared/ref:
//   text_encoder    input_ids -> last_hidden_state, pooler_output
//   text_encoder_2  input_ids -> last_hidden_state
//   vae_decoder     latents   -> sample
//   vae_encoder     image     -> mean, std

#include <string>

#include "cli/flux_args.h"
#include "models/tensor_map.h"
#include "parallel/tp_context.h"

namespace tprun::cli {

// True for the components above (false for "transformer").
bool is_other_component(const std::string& component);

// The pipeline folder's sub-folder a component name reads ("vae" for both VAE halves).
std::string component_folder(const std::string& component);

// Loads the component (validating first) and runs it. `tp` matters only for
// text_encoder_2; the others are replicated and run whole on each rank.
// RequestError naming the missing input.
models::TensorMap run_component(const FluxArgs& args, const models::TensorMap& inputs, const parallel::TpContext& tp,
                                const std::string& device, models::Trace* trace = nullptr,
                                int64_t* all_reduces_per_forward = nullptr);

}  // namespace tprun::cli
