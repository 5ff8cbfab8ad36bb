#pragma once
// Request checks the pipelines share.

#include <cstdint>
#include <string>
#include <vector>

#include "models/tensor_map.h"
#include "pipelines/generation_request.h"

namespace tprun::pipelines {

// RequestError "given tensor 'x' has shape [..]; expected [..] (meaning)"
// unless the request's given tensor `name` (when given) has `shape`; -1 in
// `shape` accepts any size there but 0 (prompt embeddings of no text tokens
// are refused).
void need_given_shape(const GenerationRequest& request, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& meaning);

// Tensors a user gives from a file (`generate --inputs`), before the model
// loads: ConfigError (on every rank) naming `source` ("--inputs x.st") and
// the tensor for one with no elements ([1, 0, D] prompt embeddings: no text
// tokens) or, for "*embeds" and "latents", one that is not floating point.
void check_given_inputs(const models::TensorMap& tensors, const std::string& source);

// RequestError naming the field and the byte offset when the prompt or the
// negative prompt holds a NUL character: the text encoders would read it
// whole but PNG text (tEXt / iTXt as libpng writes them) would end there, so
// the image's metadata would disagree with what made the image.
void need_text_prompts(const GenerationRequest& request);

}  // namespace tprun::pipelines
