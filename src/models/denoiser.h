#pragma once
// What a pipeline's denoising loop needs of its transformer, whatever the
// family: one forward on named inputs giving the prediction, and the
// attention chunking it was loaded with (the memory estimate reads it). The
// MMDiT transformers (mmdit_transformer.h) are denoisers; a 3-D video
// transformer will be one too.

#include <cstdint>

#include "models/model.h"

namespace tprun::models {

class Denoiser : public Model {
 public:
  // The prediction ("sample") in the compute dtype; the family's header
  // lists the inputs and the trace.
  virtual at::Tensor run(const TensorMap& inputs, Trace* trace = nullptr) const = 0;
  // MemoryOptions::attention_chunk as loaded (0: one attention call over all queries).
  int64_t attention_chunk() const { return attention_chunk_; }

 protected:
  int64_t attention_chunk_ = 0;
};

}  // namespace tprun::models
