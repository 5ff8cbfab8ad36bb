#pragma once
// `tprun merge-results`: the outputs of several job chunks (a Slurm job array
// over `tprun run --shard I/N`, each chunk in its own folder and resumable on
// its own) merged into one folder: results.jsonl with one record per id,
// images/, videos/ (a done request's MP4 and PNG frames) and store/ files
// hard-linked (copied across file systems). An id
// recorded `done` in two chunks is an error (no request is done twice); an id
// `failed` in one chunk and `done` in another keeps the `done` record.
//
// Nothing the chunks hold is trusted: every record path is a plain relative
// path inside its chunk (results_log.h: record_path_problem), every file it
// names resolves (symlinks followed) to a regular file inside the chunk, and
// every PNG is whole (signature to IEND, every chunk's CRC), every MP4 whole
// (jobs/mp4_file.h). --out is neither
// a chunk nor inside one (it may hold the chunks: the run's output.dir) and
// holds no results.jsonl that merge-results did not write (its .tprun-merged
// marker, a regular file, says it did); no folder on the way to a merged
// file's place is a symlink, and a file already at a place is the same file,
// a PNG tprun wrote or (a store file) the same bytes: a user's file there is
// refused, never replaced (output_folder.h place_output_file). Each chunk's lock
// is taken shared (a chunk whose run still holds its lock is refused), --out's
// exclusively. All checks come before the first write; files are then linked
// under temporary names and renamed into place, results.jsonl last, so a
// failure leaves --out as it was (one that did not exist is not created).
// Chunk folders named shard-I-of-N must be all N of the array unless
// `partial` (then a warning names the missing ones).

#include <cstdint>
#include <string>
#include <vector>

namespace tprun::jobs {

struct MergeSummary {
  int64_t done = 0, failed = 0, chunks = 0, files = 0;
  std::vector<std::string> missing_chunks;  // shard-I-of-N folders of the array not given (partial only)
};

struct MergeOptions {
  bool partial = false;  // merge some chunks of an array (the missing ones are named in a warning)
};

// Marks a folder merge-results wrote (so that a later merge may replace its results.jsonl).
inline constexpr const char* kMergedMarker = ".tprun-merged";

// ConfigError naming the folder, file and record for every refusal above;
// IoError naming the path and the errno text when the file system fails.
MergeSummary merge_results(const std::vector<std::string>& chunk_dirs, const std::string& out_dir,
                           const MergeOptions& options = {});

// Why the output file `rel` (a record path's file part, record_file) of the
// folder `dir` cannot be trusted ("" when it can): it must exist, resolve
// (every symlink along it followed) to a regular file inside `dir`, and, for a
// .png, be whole (pipelines::png_incomplete). `real`, when given, gets the
// resolved path. For merge-results and for resume.
std::string output_file_problem(const std::string& dir, const std::string& rel, std::string* real = nullptr);

}  // namespace tprun::jobs
