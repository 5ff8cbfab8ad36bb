#pragma once
// The chunk file format of the embedding cache (jobs/embedding_cache.h): the
// keys and hashes in its __metadata__, its tensor names, and the hash of one
// entry.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <xxhash.h>

#include "checkpoint/dtype.h"
#include "models/tensor_map.h"

namespace tprun::jobs {

inline constexpr const char* kKeysKey = "keys";
inline constexpr const char* kHashesKey = "hashes";

// XXH3-128 over length-prefixed fields: one entry's key, its tensors' names,
// dtypes and shapes (sorted by name) and their bytes. Fed as
// field(key), number(tensors), then per tensor tensor(...) and raw(bytes).
class EntryHash {
 public:
  EntryHash();
  ~EntryHash();
  EntryHash(const EntryHash&) = delete;
  EntryHash& operator=(const EntryHash&) = delete;

  void raw(const void* data, size_t n);
  void number(uint64_t v);
  void field(const std::string& s);
  // A tensor's description; its nbytes bytes follow through raw().
  void tensor(const std::string& name, checkpoint::Dtype dtype, const std::vector<int64_t>& shape, uint64_t nbytes);
  std::string hex() const;  // 32 lowercase hex digits

 private:
  XXH3_state_t* state_;
};

// The keys as a JSON array: a string for a UTF-8 key, {"hex": ...} otherwise
// (JSON strings hold only UTF-8).
std::string encode_keys(const std::vector<std::pair<std::string, models::TensorMap>>& entries);
// CheckpointError naming `file` for anything but such an array.
std::vector<std::string> decode_keys(const std::string& text, const std::string& file);
// The "hashes" array: one 32-hex-digit string per key; CheckpointError naming `file` otherwise.
std::vector<std::string> decode_hashes(const std::string& text, size_t keys, const std::string& file);
// "<i>/<name>" -> (i, name); CheckpointError unless i is a key's index.
std::pair<size_t, std::string> split_tensor_name(const std::string& tensor, size_t keys, const std::string& file);

}  // namespace tprun::jobs
