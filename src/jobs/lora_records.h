#pragma once
// A job's LoRA adapters as its results name them: each distinct file hashed
// once per run (XXH3-128 of its bytes), each request's adapters as records
// (results.jsonl, the HDF5 store's attributes), what resume compares, and
// the distinct sets the pipeline is told about before any compute.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "jobs/manifest.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "lora/lora_choice.h"

namespace tprun::jobs {

// The chunk the hash reads at a time: files are read sequentially, never whole.
constexpr uint64_t kLoraHashChunk = uint64_t{4} << 20;

// XXH3-128 of the file's bytes, 32 lowercase hex digits. Opened read-only
// (O_NOFOLLOW: the path is canonical, so a symlink there now was put there
// since; O_NONBLOCK: a FIFO put there since never blocks) and refused unless
// a regular file; read in kLoraHashChunk pieces. ConfigError for a file that
// is no longer a regular file, IoError (naming the path and the errno text)
// for a read that fails.
std::string lora_file_hash(const std::string& path);

// Resolved path -> hash, for every distinct adapter file of `requests` (each
// hashed once). `bytes` (optional): the bytes hashed, for the log line.
using LoraHashes = std::map<std::string, std::string>;
LoraHashes hash_lora_files(const std::vector<JobRequest>& requests, uint64_t* bytes = nullptr);
// The same as JSON text ({"<path>": "<hash>", ...}) for a broadcast, and back
// (std::runtime_error for text that is not such an object).
std::string lora_hashes_json(const LoraHashes& hashes);
LoraHashes parse_lora_hashes(const std::string& json);

// The request's adapters as its record names them: the paths as written
// (its own "loras", or the manifest's [[loras]] when it has none), resolved,
// the scales and the hashes. Error (internal) for a file missing from `hashes`.
std::vector<LoraRecord> lora_records(const JobRequest& r, const Manifest& m, const LoraHashes& hashes);

// The records as the HDF5 store's "loras" attribute holds them (the same JSON
// array as results.jsonl's "loras"); "" for none.
std::string lora_records_json(const std::vector<LoraRecord>& records);

// How a `done` record's adapters differ from what the request asks for now.
// content: another file content (hash), scale, count or order, so the image
// was made otherwise; names: the same bytes and scales, but the paths (as
// written or resolved) differ. `what` says it for a log line ("" when equal).
struct LoraChange {
  bool content = false;
  bool names = false;
  std::string what;
};
LoraChange lora_change(const std::vector<LoraRecord>& recorded, const std::vector<LoraRecord>& now);

// The distinct adapter sets of `requests` (their lora_set(), the empty set
// included when a request runs without adapters), in order of first
// appearance: what Pipeline::prepare_loras is told before any compute.
std::vector<std::vector<lora::LoraChoice>> distinct_lora_sets(const std::vector<const JobRequest*>& requests);

}  // namespace tprun::jobs
