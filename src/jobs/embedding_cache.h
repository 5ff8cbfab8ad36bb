#pragma once
// The on-disk text-embedding cache of staged jobs: <output_dir>/embeddings/
// <fingerprint>/, one safetensors file per chunk of encoded texts. A rerun of
// the job (after a crash, with more requests) reuses every complete chunk
// whose fingerprint (jobs/embedding_fingerprint.h) matches its encoders.
//
// A chunk file holds, for entry i of its keys, the tensors "<i>/<tensor
// name>" in their own dtype and shape, and in its __metadata__:
//   "tprun_embeddings": "2", "fingerprint": the folder's fingerprint,
//   "keys": a JSON array of the keys, each a string, or {"hex": "..."} for a
//           key that is not valid UTF-8,
//   "hashes": a JSON array, for entry i the XXH3-128 (32 lowercase hex
//           digits) of its key, its tensors' names, dtypes and shapes and
//           their bytes (entry_hash below).
// Files are written atomically and never replaced. A chunk is trusted only
// when proven: its header, keys and hashes agree, every tensor has elements
// and (floating point) the job's dtype, the job's own check of the key's
// tensors passes, and no other file holds one of its keys.
//
// Who reads what (docs/jobs.md "The embedding cache"): one process, the
// sweeper (world rank 0 of a job), reads every chunk whole with sweep(),
// moves each unusable one aside to "<name>.bad-<n>" in the same folder (never
// deleted; a symlink, folder or FIFO there is renamed, never opened) and
// names the good ones; every rank then indexes exactly those by their header.
// get() checks the entry's hash again as it reads it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_header.h"
#include "jobs/embedding_fingerprint.h"
#include "models/tensor_map.h"

namespace tprun::jobs {

// What a chunk's entries must be for the job that reads them.
struct ChunkRules {
  // Every floating-point tensor has this dtype (the job's compute dtype);
  // unset: any.
  std::optional<checkpoint::Dtype> float_dtype;
  // The job's own check of one key's tensors (named without the "<i>/"
  // prefix; shapes and dtypes only, nothing read): "" when usable, else why
  // not. Unset: none.
  std::function<std::string(const std::string& key, const std::vector<checkpoint::TensorEntry>& tensors)>
      check_entry;
};

class EmbeddingCache {
 public:
  // Indexes every complete chunk file (*.safetensors) in
  // <output_dir>/embeddings/<fingerprint>/ by its header only. Skipped with
  // one warning naming it (kept on disk, not moved): a file that is not a
  // regular file, torn, not a safetensors file or with a header over the
  // reader's limit, whose metadata is not ours or names another fingerprint,
  // whose keys do not match its tensors or its hashes, that breaks `rules`,
  // or that shares a key with another file (both are skipped). Dot files
  // (".<name>.tmp" left by a crashed write) are ignored. Nothing is created
  // until the first write. `fingerprint`: letters, digits, '-', '_'.
  // ConfigError when embeddings/ or its fingerprint folder is a symlink or
  // not a folder (check_cache_folders).
  EmbeddingCache(const std::string& output_dir, const std::string& fingerprint, ChunkRules rules = {});
  // Indexes exactly the chunk files `names` (what sweep() returned on the
  // sweeper), by their header; CheckpointError naming a file that cannot be
  // used now.
  EmbeddingCache(const std::string& output_dir, const std::string& fingerprint, ChunkRules rules,
                 const std::vector<std::string>& names);

  // The sweeper's pass: checks every entry named *.safetensors in the folder
  // as the first constructor does and reads every chunk whole against its
  // hashes; moves each unusable one aside ("<name>.bad-<n>", the lowest n
  // free) with one warning naming it, what is wrong and where it went (a
  // file that cannot be moved stays, unused, with a warning saying so).
  // Never opens anything but a regular file, never follows a symlink.
  // Returns the names of the good chunks, sorted. ConfigError as
  // check_cache_folders.
  static std::vector<std::string> sweep(const std::string& output_dir, const std::string& fingerprint,
                                        const ChunkRules& rules);
  // ConfigError naming the path when <output_dir>/embeddings or its
  // <fingerprint> folder exists and is a symlink (it could lead outside the
  // output folder) or not a folder.
  static void check_cache_folders(const std::string& output_dir, const std::string& fingerprint);

  bool contains(const std::string& key) const;
  // The tensors stored for `key` (CPU, their stored dtype and shape; names as
  // written), read from its chunk file and checked against its hash.
  // CheckpointError naming the file when it cannot be read, changed since it
  // was indexed or its bytes do not match (saying to move it aside and rerun);
  // naming the folder when the key is not there.
  models::TensorMap get(const std::string& key) const;
  // Writes one chunk file holding `entries` (key -> tensors; keys any bytes,
  // each key once, each with at least one tensor of at least one element),
  // then indexes it. Atomic: ".<name>.tmp" in the same folder, fsync'd,
  // renamed to <name>, the folder fsync'd. `name`: a plain file name ending
  // in ".safetensors" ("r0-<hash>.safetensors"); when a file (of any kind)
  // already has that name, it is never replaced: the chunk is written as
  // "<stem>-<n>.safetensors" (the lowest n from 1 free). Returns the name
  // written ("" when there are no entries: nothing is written). Creates
  // embeddings/ and embeddings/<fingerprint>/ inside `output_dir` (which
  // must exist) the first time (ConfigError for a symlink there, as
  // check_cache_folders). Keys already indexed keep their first value.
  std::string write_chunk(const std::string& name,
                          const std::vector<std::pair<std::string, models::TensorMap>>& entries);

  // Indexes the chunk file `name` that another process (the TP group's
  // writer) has just written with write_chunk. CheckpointError naming the
  // file when it is missing or cannot be used.
  void index_chunk(const std::string& name);

  size_t size() const { return index_.size(); }  // keys indexed
  const std::string& folder() const { return folder_; }  // <output_dir>/embeddings/<fingerprint>

 private:
  struct ChunkFile {
    std::string path;
    uint64_t data_start = 0;
    uint64_t file_size = 0;
    int64_t mtime_ns = 0;
  };
  struct Location {
    size_t file = 0;                                // into files_
    std::vector<checkpoint::TensorEntry> tensors;   // named without the "<i>/" prefix, sorted by name
    std::string hash;                               // entry_hash, 32 hex digits
  };
  struct Parsed;

  // Checks one chunk file's header (and with `whole`, its bytes); CheckpointError when it cannot be used.
  static Parsed parse_file(const std::string& path, const std::string& fingerprint, const ChunkRules& rules,
                           bool whole);
  void add(Parsed&& parsed);
  void make_folder() const;

  std::string output_dir_;
  std::string fingerprint_;
  std::string folder_;
  ChunkRules rules_;
  std::vector<ChunkFile> files_;
  std::unordered_map<std::string, Location> index_;
};

}  // namespace tprun::jobs
