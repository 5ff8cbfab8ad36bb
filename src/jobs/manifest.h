#pragma once
// A job manifest (TOML): which model, how it is laid out over the ranks,
// generation defaults, the requests file and the outputs. Every key is known:
// an unknown key or a value of the wrong type is a ConfigError naming
// file:line and the key, so a typo is never ignored. docs/jobs.md's
// "Manifest reference" lists every key with its default.
//
//   model = "models/flux-tiny"        # pipeline folder, relative to the manifest
//   dtype = "fp32"                    # fp32 | bf16 | fp16
//   requests = "prompts.jsonl"        # JSONL, relative to the manifest
//   [parallel]  tp = 1 (or "auto": the fit planner's choice), dp = 0 (0: world / tp), device = "auto", allow_cross_node_tp = false,
//               shard_text_encoders (unset: the pipeline's choice), shard_modulation = false
//   [memory]    layerwise_casting, offload, device_map, max_memory, offload_folder, vae_slicing,
//               vae_tiling, vae_tile_sample_size, vae_tile_overlap, attention_chunk
//               (memory/memory_options.h; read by memory/memory_table.h)
//   [defaults]  height, width, steps, guidance, true_cfg_scale, negative_prompt,
//               max_sequence_length, frames, fps, guidance_2 (each: the pipeline's default when unset; bounded as every
//               request is, pipelines::request_bound, then by the pipeline's own limits and the
//               options it uses in check_defaults), seed = 0 (the base seed)
//   [output]    dir = "out", formats = ["png"] (png | mp4 | frames: jobs/video_output.h | hdf5 | latents:
//               jobs/hdf5_store.h), batch_size = 1
//               (same-shape requests denoised together, see job_runner.h)
//   [schedule]  phases = "auto" (together | staged | auto: staged where together does not fit),
//               stage_requests = 0 (staged: pending requests encoded per round; 0 = all of them),
//               device_memory = "" (per rank, for the planner: "80GB"; default what the device reports)
//   [[loras]]   path (a .safetensors file, relative to the manifest), scale = 1.0: the job's adapters, in order
//               (jobs/lora_paths.h); they become defaults.loras, the set of every request without its own "loras"
//   [lora]      strict = true (keys that map to no module: an error; false: a warning, skipped),
//               apply = "auto" (auto | fused | runtime), dirs = [] (more folders a request's adapters may come
//               from, besides the manifest's folder and the folders of the [[loras]] files)
//
// CLI overrides (`--set defaults.steps=4`, `--out DIR`) are applied to the
// parsed document before validation; their errors name the override.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memory/memory_options.h"
#include "pipelines/generation_request.h"

namespace tprun::pipelines {
struct RequestOptions;
}

namespace tprun::jobs {

struct Manifest {
  std::string path;      // the manifest file
  std::string model;     // absolute or relative to the current folder (resolved against the manifest)
  std::string dtype = "fp32";
  std::string requests;  // resolved path of the JSONL file
  int tp = 1;            // 0: "auto" (tprun plan's choice at start)
  int dp = 0;            // 0: world / tp
  std::string device = "auto";
  bool allow_cross_node_tp = false;
  std::optional<bool> shard_text_encoders;  // unset: the pipeline's choice
  bool shard_modulation = false;            // the transformer's AdaLN modulations rowwise_split_input
  memory::MemoryOptions memory;             // [memory]
  // [defaults]: the fields set there (unset ones take the pipeline's own
  // defaults); `seed` is the base seed a request without its own seed
  // derives from (derive_seed(seed, id)); negative_prompt "" = none.
  pipelines::GenerationRequest defaults;
  // Where each [defaults] key was set ("<file>:<line>: defaults.steps" or
  // "--set defaults.steps"), by key ("steps"), for check_defaults' messages.
  std::map<std::string, std::string> defaults_where;
  std::string output_dir = "out";  // resolved against the manifest
  bool png = true, hdf5 = false, latents = false;
  // Videos (frame sequences; image pipelines refuse them: check_formats):
  // "mp4" videos/<id>.mp4, "frames" videos/<id>/frame_00000.png ...
  bool mp4 = false, frame_pngs = false;
  int64_t batch_size = 1;
  // [schedule]: "together" (every component resident), "staged" (encode the
  // pending prompts, free the encoders, then denoise), "auto" (staged where
  // the fit planner says together does not fit).
  std::string phases = "auto";
  int64_t stage_requests = 0;  // staged: requests per encode/denoise round; 0 = all pending
  // A pipeline with two experts (Wan 2.2 A14B): "resident" (both loaded),
  // "staged" (one at a time: a round's batches through the high-noise
  // expert, then the swap), "auto" (staged where the fit planner says
  // resident does not fit). Other pipelines ignore it.
  std::string experts = "auto";
  // The memory per rank the fit planner plans for (parallel.tp = "auto",
  // phases = "auto"); 0 = what the device (CUDA) or the host reports.
  uint64_t device_memory = 0;
  // [[loras]]: the job's adapters are defaults.loras (unset when the manifest
  // has no [[loras]]; paths made absolute against the manifest's folder, and
  // by resolve_manifest_loras through their symlinks). Per entry, in order:
  // the path as written and where it was set ("<file>:<line>: loras[0].path").
  std::vector<std::string> lora_written;
  std::vector<std::string> lora_where;
  // [lora]: the pipeline's options (PipelineOptions::lora_strict, lora_apply)
  // and the folders a request's own adapters may come from (absolute; see
  // jobs/lora_paths.h for the whole rule).
  bool lora_strict = true;
  std::string lora_apply = "auto";  // auto | fused | runtime
  std::vector<std::string> lora_dirs;
  std::string lora_dirs_where;  // "<file>:<line>: lora.dirs", for messages
};

// The most folders [lora] dirs may list.
constexpr size_t kMaxLoraDirs = 256;

// key=value, the key dotted ("defaults.steps", "output.dir", "model"). The
// value is read as TOML ("4", "3.5", "true", "\"x\"", "[\"png\"]"); a value
// that is not valid TOML is taken as a string (so `--set model=/data/m` works).
using Override = std::pair<std::string, std::string>;  // the type apply_override (runtime/strict_toml.h) takes
Override parse_override(const std::string& text);  // ConfigError for a text without '='

// Parses and validates; relative paths are resolved against the manifest's
// folder. ConfigError "<file>:<line>: <key>: ..." (or "--set <key>: ...").
// Does not check that the model folder or the requests file exist (see
// check_paths): parse errors come first.
Manifest parse_manifest(const std::string& path, const std::vector<Override>& overrides = {});
// The same from the manifest's text (`path` names it in messages and anchors
// relative paths). Used by the fuzz target.
Manifest parse_manifest_text(const std::string& text, const std::string& path,
                             const std::vector<Override>& overrides = {});

// ConfigError naming the manifest key when the model folder (model_index.json)
// or the requests file is missing.
void check_paths(const Manifest& m);

// ConfigError "<where>: <what> (model M)" for a [defaults] value the
// pipeline refuses (pipelines::check_request_options): max_sequence_length
// beyond its limit, fewer steps than its scheduler takes, an option it does
// not use. Before any weight is loaded, so a bad default fails the job once.
void check_defaults(const Manifest& m, const pipelines::RequestOptions& options);
// The same with the options of the pipeline m.model names (read from its
// configs, after check_paths).
void check_defaults(const Manifest& m);
// ConfigError "<manifest>: output.formats: ..." for a video format (mp4,
// frames) to a pipeline that makes images, and for mp4 where no ffmpeg
// program can write it (video_output.h mp4_writer_problem). Before any load.
void check_formats(const Manifest& m, const pipelines::RequestOptions& options);

}  // namespace tprun::jobs
