#pragma once
// The requests of a job: a JSONL file, one JSON object per line (blank lines
// and lines starting with '#' are skipped):
//   {"id": "fox-1", "prompt": "a red fox", "seed": 7, "steps": 4, ...}
// `id` (required; a string or a non-negative integer; letters, digits, '.', '_'
// and '-', at most 128 characters, not starting with '.') names the outputs and
// must be unique; `prompt` is required; optional per-request overrides:
// negative_prompt, height, width, steps, guidance, guidance_2 (a second
// expert's; two-expert pipelines only), true_cfg_scale, max_sequence_length,
// frames (of a frame sequence; image pipelines take only 1), fps (of a
// video; image pipelines refuse it), seed, loras (the request's own LoRA
// adapters, replacing the manifest's [[loras]]: [{"path": "a.safetensors",
// "scale": 0.7}, ...], [] = none; at most lora::kMaxLorasPerRequest, each
// scale finite within kMaxLoraScale, default 1.0; paths as jobs/lora_paths.h
// rules). Any other key is an error. Errors name
// "<file>:<line>: <field>". Numbers are held to pipelines::request_bound (the
// bounds `generate` and [defaults] share); the pipeline's own limits
// (max_sequence_length, steps, the options it uses) are checked per request
// by its check_request, before any request runs.
//
// Seeds: a request's seed is its own `seed` when given, else
// derive_seed(base seed, id): never dependent on the order of the file, on dp
// or on tp.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "jobs/manifest.h"

namespace tprun::jobs {

struct JobRequest {
  std::string id;
  int64_t line = 0;  // 1-based line in the requests file
  // The manifest's [defaults] applied (fields neither sets stay unset for the
  // pipeline's defaults), seed resolved.
  pipelines::GenerationRequest gen;
  bool seed_given = false;
  // The request's own "loras" paths as written, one per gen.loras entry
  // (own_loras); a request without "loras" runs with the manifest's
  // [[loras]] (Manifest::lora_written says how those were written).
  bool own_loras = false;
  std::vector<std::string> lora_written;
};

// How a request's adapter paths become files (jobs/lora_paths.h
// LoraPathRule::resolve): "" with `resolved` set, or why the path is refused
// (the message then reads "<file>:<line>: loras[i].path: <path> <why>"). An
// empty function keeps each path as written (the fuzz target, `tprun plan`).
using LoraResolver = std::function<std::string(const std::string& written, std::string& resolved)>;

// SplitMix64 of (base XOR FNV-1a-64(id)), masked to 53 bits so that JSON
// readers holding numbers as doubles read it exactly.
uint64_t derive_seed(uint64_t base_seed, const std::string& id);

// The longest line read_requests accepts (bytes): 1 MiB.
constexpr size_t kMaxRequestLine = size_t{1} << 20;

// The manifest's `requests` path names a readable regular file: ConfigError
// "<manifest>: requests: <path>: no such file" / "is a directory" / "is not a
// regular file (a character device)" otherwise (so /dev/zero is never read).
void check_requests_file(const std::string& manifest, const std::string& path);

// ConfigError "<file>:<line>: <field>: ..." for the first bad line (values and
// ids in messages are cut to 64 characters).
std::vector<JobRequest> read_requests(const std::string& path, const pipelines::GenerationRequest& defaults,
                                      const LoraResolver& resolve_lora = {});

// Parses one line (exposed for the fuzz target and tests).
JobRequest parse_request_line(const std::string& text, const std::string& file, int64_t line,
                              const pipelines::GenerationRequest& defaults, const LoraResolver& resolve_lora = {});

}  // namespace tprun::jobs
