#pragma once
// The strict safetensors header parser (torch-free; fuzzed).
//
// Layout: 8-byte little-endian header length N (at most 100,000,000), N bytes
// of JSON (an object; optional "__metadata__" of string -> string; every other
// key a tensor {"dtype", "shape", "data_offsets"}), then the data. Checked:
// no duplicate keys; known dtypes; non-negative shapes; byte size =
// product(shape) x dtype width, overflow-checked; offsets contiguous from 0
// with no hole or overlap; the data ends exactly at the end of the file.
// Every error is a CheckpointError naming the file and the tensor.

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/dtype.h"

namespace tprun::checkpoint {

constexpr uint64_t kMaxHeaderBytes = 100000000;

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the start of the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::string file;
  uint64_t header_bytes = 0;  // N
  uint64_t data_start = 0;    // 8 + N
  uint64_t file_size = 0;
  std::vector<TensorEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;

  const TensorEntry* find(const std::string& name) const;
  uint64_t data_bytes() const { return file_size - data_start; }

 private:
  friend SafetensorsHeader parse_safetensors_header(const std::string&, const std::string&, uint64_t);
  std::unordered_map<std::string, size_t> by_name_;
};

// `json` is the N header bytes; `file_size` the whole file's size.
SafetensorsHeader parse_safetensors_header(const std::string& file, const std::string& json,
                                           uint64_t file_size);

// Checks the 8-byte prefix of a file of `file_size` bytes; returns N.
uint64_t check_header_length(const std::string& file, const uint8_t prefix[8], uint64_t file_size);

// Parses a whole file held in memory (the fuzz target's entry point).
SafetensorsHeader parse_safetensors_buffer(const std::string& file, const uint8_t* data, size_t size);

// Reads and parses a file's header (reads only the header bytes).
SafetensorsHeader read_safetensors_header(const std::string& path);

// "[3072, 64]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace tprun::checkpoint
