#pragma once
// Writes safetensors files the way the reference implementation does:
// tensors ordered by dtype width (widest first) then name, header padded with
// spaces to 8 bytes, optional __metadata__. Always atomic: a temporary file in
// the same folder, fsync, rename. Bytes come from memory or are copied in
// bounded chunks from another file (re-sharding never holds a whole tensor).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/dtype.h"

namespace tprun::checkpoint {

struct TensorPayload {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // in memory, or:
  std::string src_file;        // copied from this file ...
  uint64_t src_offset = 0;     // ... starting at this absolute offset
  uint64_t nbytes() const;
};

// Throws CheckpointError (naming `path`) on I/O failure, or when `path`
// exists and !overwrite.
void write_safetensors(const std::string& path, std::vector<TensorPayload> tensors,
                       const std::map<std::string, std::string>& metadata = {}, bool overwrite = false);

// Writes a small text file atomically (temp + rename).
void write_file_atomically(const std::string& path, const std::string& contents, bool overwrite);

}  // namespace tprun::checkpoint
