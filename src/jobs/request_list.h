#pragma once
// The requests of a job: a JSONL file, one JSON object per line (blank lines
// and lines starting with '#' are skipped):
//   {"id": "fox-1", "prompt": "a red fox", "seed": 7, "steps": 4, ...}
// `id` (required; a string or a non-negative integer; letters, digits, '.', '_'
// and '-', at most 128 characters, not starting with '.') names the outputs and
// must be unique; `prompt` is required; optional per-request overrides:
// negative_prompt, height, width, steps, guidance, true_cfg_scale,
// max_sequence_length, seed. Any other key is an error. Errors name
// "<file>:<line>: <field>".
//
// Seeds: a request's seed is its own `seed` when given, else
// derive_seed(base seed, id): never dependent on the order of the file, on dp
// or on tp.

#include <cstdint>
#include <string>
#include <vector>

#include <optional>

#include "jobs/manifest.h"

namespace tprun::jobs {

// A request's generation parameters (defaults applied); the job runner turns
// them into a pipelines::GenerationRequest.
struct GenerationParams {
  std::string prompt;
  std::optional<std::string> negative_prompt;
  int64_t height = 1024, width = 1024, steps = 28;
  double guidance = 3.5, true_cfg_scale = 1.0;
  uint64_t seed = 0;
  int64_t max_sequence_length = 512;
};

struct JobRequest {
  std::string id;
  int64_t line = 0;  // 1-based line in the requests file
  GenerationParams gen;  // defaults applied, seed resolved
  bool seed_given = false;
  // Relative cost (pixels x steps x forwards per step), for scheduling.
  double cost() const;
};

// SplitMix64 of (base XOR FNV-1a-64(id)), masked to 53 bits so that JSON
// readers holding numbers as doubles read it exactly.
uint64_t derive_seed(uint64_t base_seed, const std::string& id);

// ConfigError "<file>:<line>: <field>: ..." for the first bad line.
std::vector<JobRequest> read_requests(const std::string& path, const GenerationDefaults& defaults);

// Parses one line (exposed for the fuzz target and tests).
JobRequest parse_request_line(const std::string& text, const std::string& file, int64_t line,
                              const GenerationDefaults& defaults);

}  // namespace tprun::jobs
