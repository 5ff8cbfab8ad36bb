#pragma once
// The on-disk text-embedding cache of staged jobs: <output_dir>/embeddings/
// <fingerprint>/, one safetensors file per chunk of encoded texts. A rerun of
// the job (after a crash, with more requests) reuses every complete chunk
// whose fingerprint (jobs/embedding_fingerprint.h) matches its encoders.
//
// A chunk file holds, for entry i of its keys, the tensors "<i>/<tensor
// name>" in their own dtype and shape, and in its __metadata__:
//   "tprun_embeddings": "1", "fingerprint": the folder's fingerprint,
//   "keys": a JSON array of the keys, each a string, or {"hex": "..."} for a
//           key that is not valid UTF-8.
// Files are written atomically and never replaced; a file that is torn, not
// ours, or of another fingerprint is skipped with a warning, never deleted.

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "checkpoint/safetensors_header.h"
#include "jobs/embedding_fingerprint.h"
#include "models/tensor_map.h"

namespace tprun::jobs {

class EmbeddingCache {
 public:
  // Indexes every complete chunk file (*.safetensors) in
  // <output_dir>/embeddings/<fingerprint>/ by its header only. Skipped with
  // one warning naming it: a torn file, one that is not a safetensors file or
  // has a header over the reader's limit, one whose metadata is not ours or
  // names another fingerprint, one whose keys do not match its tensors.
  // Dot files (".<name>.tmp" left by a crashed write) are ignored. Nothing is
  // created until the first write. `fingerprint`: letters, digits, '-', '_'.
  EmbeddingCache(const std::string& output_dir, const std::string& fingerprint);

  bool contains(const std::string& key) const;
  // The tensors stored for `key` (CPU, their stored dtype and shape; names as
  // written), read from its chunk file. CheckpointError naming the file when
  // it cannot be read or changed since it was indexed; naming the folder when
  // the key is not there.
  models::TensorMap get(const std::string& key) const;
  // Writes one chunk file holding `entries` (key -> tensors; keys any bytes,
  // each key once, each with at least one tensor), then indexes it. Atomic:
  // ".<name>.tmp" in the same folder, fsync'd, renamed to <name> (never over
  // an existing file: CheckpointError), the folder fsync'd. `name`: a plain
  // file name ending in ".safetensors" ("r0-c3-<hash>.safetensors"). Creates
  // embeddings/ and embeddings/<fingerprint>/ inside `output_dir` (which
  // must exist) the first time. No entries: nothing is written. Keys already
  // indexed keep their first value.
  void write_chunk(const std::string& name, const std::vector<std::pair<std::string, models::TensorMap>>& entries);

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
    std::vector<checkpoint::TensorEntry> tensors;   // named without the "<i>/" prefix
  };

  // Checks and indexes one chunk file; CheckpointError (the file is not
  // indexed) when it cannot be used.
  void index_file(const std::string& path);
  void make_folder() const;

  std::string output_dir_;
  std::string fingerprint_;
  std::string folder_;
  std::vector<ChunkFile> files_;
  std::unordered_map<std::string, Location> index_;
};

}  // namespace tprun::jobs
