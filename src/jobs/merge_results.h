#pragma once
// `tprun merge-results`: the outputs of several job chunks (a Slurm job array
// over `tprun run --shard I/N`, each chunk in its own folder and resumable on
// its own) merged into one folder: results.jsonl with one record per id,
// images/ and store/ files hard-linked (copied across file systems). An id
// recorded `done` in two chunks is an error (no request is done twice); an id
// `failed` in one chunk and `done` in another keeps the `done` record.

#include <cstdint>
#include <string>
#include <vector>

namespace tprun::jobs {

struct MergeSummary {
  int64_t done = 0, failed = 0, chunks = 0, files = 0;
};

// ConfigError naming the folder (missing results.jsonl, an id done twice, an
// output file a record names that does not exist). Writes results.jsonl
// atomically, last.
MergeSummary merge_results(const std::vector<std::string>& chunk_dirs, const std::string& out_dir);

}  // namespace tprun::jobs
