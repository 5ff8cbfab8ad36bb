#pragma once
// What the text embeddings of a pipeline folder depend on, as one hex string:
// the name of the folder of its on-disk embedding cache (jobs/embedding_cache.h),
// so that embeddings made by other encoders or settings are never reused.

#include <cstdint>
#include <string>

namespace tprun::jobs {

// Files up to this size are hashed by their bytes (configs, tokenizer files,
// index JSONs); larger ones (weights) by name, size and modification time.
inline constexpr uint64_t kFingerprintBytesLimit = 64ull << 20;
// A component folder holding more entries than this is refused (not walked).
inline constexpr int64_t kFingerprintMaxFiles = 10000;

// XXH3-128 (32 hex digits) of: a format version; the pipeline class
// (model_index.json's _class_name) and model_index.json's bytes; for every
// component named "text_encoder*" or "tokenizer*", every file of its folder
// (recursively, sorted by relative path): its bytes when at most
// kFingerprintBytesLimit, else its size and mtime (ns); and `settings` (the
// caller's: tprun's version, dtype, device kind, TP size and sharding of
// the encoders, their memory options; jobs/staged_phases.h). Symlinked files are followed (a Hugging Face snapshot links every
// file into ../../blobs); symlinked folders only when they lie inside
// `model_folder`, otherwise the link's target text stands for them.
// CheckpointError for a folder that is not a pipeline folder, a component
// folder with more than kFingerprintMaxFiles entries (naming it), or a file
// that cannot be read.
std::string embedding_fingerprint(const std::string& model_folder, const std::string& settings);

}  // namespace tprun::jobs
