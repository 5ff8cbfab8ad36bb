#pragma once
// Request checks the pipelines share, and what each pipeline class takes
// (RequestOptions): read from a folder's configs without a weight byte, so
// a manifest's [defaults] and `tprun tokenize` are checked before any load,
// and each request against the very same rules by the pipeline's
// check_request. A family's spec (pipeline_spec.h) holds its reader.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "models/tensor_map.h"
#include "pipelines/generation_request.h"

namespace tprun::checkpoint {
struct PipelineFolder;
}

namespace tprun::pipelines {

// What one pipeline class (with its folder's configs) does with a request's options.
struct RequestOptions {
  std::string cls;                      // model_index.json's _class_name
  int64_t max_sequence_length = 512;    // its text encoder's limit
  int64_t min_steps = 1;                // fewer steps than its scheduler can take
  std::string min_steps_reason;         // why, where min_steps > 1 (naming the config file and key)
  // Frames a request may ask for. 1: the pipeline makes images (every family
  // today), and a request's frames other than 1 is refused by name. A family
  // that makes frame sequences sets the most it takes and, where its VAE
  // compresses time, the step between frame counts: frames - 1 must be a
  // multiple of frame_multiple (Wan: 4, so 4k + 1 frames).
  int64_t max_frames = 1;
  std::string max_frames_reason;        // why, where a folder's config (not kMaxFrames) sets max_frames
  int64_t frame_multiple = 1;
  std::string frame_multiple_reason;    // why, where frame_multiple > 1
  // Frames per second of its videos when a request leaves `fps` unset (a
  // frame-sequence pipeline, max_frames > 1: Wan 2.1's examples export at
  // 16). An image pipeline (max_frames = 1) refuses `fps` by name.
  int64_t default_fps = 16;
  // Whether it applies `guidance_2` (a second expert's guidance scale:
  // Wan 2.2 A14B's guidance_scale_2); every other pipeline refuses it by
  // name.
  bool accepts_guidance_2 = false;
  // Options it never applies, each with why: a request or [defaults] that
  // sets one is refused (never rendered without it and recorded with it).
  std::vector<std::pair<std::string, std::string>> unused;

  bool uses(const std::string& option) const;
  // `defaults` without the options this pipeline does not use (so with_defaults never fills one).
  GenerationRequest drop_unused(GenerationRequest defaults) const;
  // The pipeline's __call__ defaults made its request defaults: drop_unused,
  // and fps = default_fps where it makes frame sequences (max_frames > 1).
  GenerationRequest request_defaults(GenerationRequest call_defaults) const;
  bool makes_videos() const { return max_frames > 1; }
};

using RequestOptionsReader = std::function<RequestOptions(const checkpoint::PipelineFolder& folder)>;

// The RequestOptions of the pipeline `folder`'s model_index.json names.
// ConfigError naming the folder for one that is not a pipeline folder or a
// class without registered options; CheckpointError for bad configs.
RequestOptions request_options(const std::string& folder);
// The same for an opened folder (the pipelines' loads).
RequestOptions request_options(const checkpoint::PipelineFolder& folder);
// min_steps from the folder's scheduler/scheduler_config.json: a
// shift_terminal stretch divides by 1 - the last sigma, which is 0 for one
// step (diffusers divides by zero there too), so it takes 2 at least.
void add_scheduler_request_options(const checkpoint::PipelineFolder& folder, RequestOptions& options);

// `fail(key, what)` (which throws) for the first field of `r` this pipeline
// refuses: max_sequence_length beyond its limit, fewer steps than its
// scheduler can take, frames other than 1 to an image pipeline (or beyond
// max_frames, or not 1 + a multiple of frame_multiple), fps to an image
// pipeline, guidance_2 to one that does not accept it, an option it does
// not use. The bounds every pipeline
// shares (check_request_bounds) first. `r` as given or with defaults
// applied (with_defaults never fills an unused option).
void check_request_options(const GenerationRequest& r, const RequestOptions& options, const RequestFail& fail);
// The same throwing RequestError "<key>: <what>" (the pipelines' check_request).
void need_request_options(const GenerationRequest& r, const RequestOptions& options);


// RequestError unless max_sequence_length is in [1, limit] (`cls`'s limit).
void check_max_sequence_length(const GenerationRequest& r, const std::string& cls, int64_t limit);

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
