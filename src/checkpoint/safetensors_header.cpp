#include "checkpoint/safetensors_header.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::checkpoint {
namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", file, what));
}

[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor, const std::string& what) {
  throw CheckpointError(fmt::format("{}: tensor '{}': {}", file, tensor, what));
}

uint64_t non_negative(const nlohmann::json& v, const std::string& file, const std::string& tensor,
                      const char* field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    fail_tensor(file, tensor, fmt::format("{} has the negative value {}", field, v.get<int64_t>()));
  }
  fail_tensor(file, tensor, fmt::format("{} must hold non-negative integers, found {}", field, v.dump()));
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const TensorEntry* SafetensorsHeader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors[it->second];
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

uint64_t check_header_length(const std::string& file, const uint8_t p[8], uint64_t file_size) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  if (n > kMaxHeaderBytes) {
    fail(file, fmt::format("header length {} exceeds the format's limit of {} bytes (not a "
                           "safetensors file, or corrupt)",
                           n, kMaxHeaderBytes));
  }
  if (n + 8 > file_size) {
    fail(file, fmt::format("header length {} runs past the end of the {}-byte file (truncated?)", n,
                           file_size));
  }
  return n;
}

namespace {

// "__metadata__": an object of strings.
void parse_metadata(const std::string& file, const nlohmann::json& v, std::map<std::string, std::string>& out) {
  if (!v.is_object()) fail(file, "__metadata__ must be an object of strings");
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) {
      fail(file, fmt::format("__metadata__ value of '{}' must be a string, found {}", m.key(),
                             m.value().type_name()));
    }
    out[m.key()] = m.value().get<std::string>();
  }
}

// One tensor's entry: exactly dtype, shape and data_offsets, whose span holds
// the bytes the dtype and shape need.
TensorEntry parse_tensor_entry(const std::string& file, const std::string& name, const nlohmann::json& v) {
  if (!v.is_object()) fail_tensor(file, name, fmt::format("entry must be an object, found {}", v.type_name()));
  for (auto f = v.begin(); f != v.end(); ++f) {
    if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
      fail_tensor(file, name, fmt::format("unknown field '{}'", f.key()));
  }
  if (!v.contains("dtype") || !v["dtype"].is_string()) fail_tensor(file, name, "missing string field 'dtype'");
  if (!v.contains("shape") || !v["shape"].is_array()) fail_tensor(file, name, "missing array field 'shape'");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    fail_tensor(file, name, "'data_offsets' must be an array [begin, end]");

  TensorEntry e;
  e.name = name;
  const std::string dt = v["dtype"].get<std::string>();
  auto parsed = parse_dtype(dt);
  if (!parsed) fail_tensor(file, name, fmt::format("unknown dtype '{}' (known: {})", dt, all_dtype_names()));
  e.dtype = *parsed;
  // bits = product(shape) * width, overflow-checked in 128 bits.
  unsigned __int128 bits = static_cast<unsigned __int128>(dtype_bits(e.dtype));
  for (const auto& d : v["shape"]) {
    const uint64_t dim = non_negative(d, file, name, "shape");
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(file, name, fmt::format("shape dimension {} is too large", dim));
    e.shape.push_back(static_cast<int64_t>(dim));
    bits *= dim;
    if (bits > (static_cast<unsigned __int128>(1) << 64))
      fail_tensor(file, name, fmt::format("shape {} overflows the byte size", v["shape"].dump()));
  }
  if (bits % 8 != 0)
    fail_tensor(file, name, fmt::format("shape {} of {} does not fill whole bytes", shape_string(e.shape), dt));
  const uint64_t nbytes = static_cast<uint64_t>(bits / 8);
  e.begin = non_negative(v["data_offsets"][0], file, name, "data_offsets");
  e.end = non_negative(v["data_offsets"][1], file, name, "data_offsets");
  if (e.end < e.begin)
    fail_tensor(file, name, fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
  if (e.end - e.begin != nbytes) {
    fail_tensor(file, name, fmt::format("data_offsets [{}, {}] hold {} bytes, but {} {} needs {}",
                                        e.begin, e.end, e.end - e.begin, dt, shape_string(e.shape), nbytes));
  }
  return e;
}

// Contiguity: sorted by offset, each tensor starts where the previous ended,
// and the last ends where the file does.
void check_data_layout(const std::string& file, const SafetensorsHeader& h) {
  std::vector<const TensorEntry*> by_offset;
  for (const auto& e : h.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry* e : by_offset) {
    if (e->begin > expected) {
      fail_tensor(file, e->name, fmt::format("data starts at {} but the previous tensor{} ends at {}: "
                                             "a hole in the data",
                                             e->begin, prev ? " '" + prev->name + "'" : "", expected));
    }
    if (e->begin < expected) {
      fail_tensor(file, e->name, fmt::format("data [{}, {}] overlaps tensor '{}' (ends at {})", e->begin,
                                             e->end, prev ? prev->name : "?", expected));
    }
    expected = e->end;
    prev = e;
  }
  const uint64_t data_bytes = h.file_size - h.data_start;
  if (expected != data_bytes) {
    if (expected > data_bytes) {
      fail_tensor(file, prev ? prev->name : "?",
                  fmt::format("data ends at {} but the file holds only {} data bytes (truncated?)",
                              expected, data_bytes));
    }
    fail(file, fmt::format("{} bytes after the last tensor's data (tensors end at {}, data is {} bytes)",
                           data_bytes - expected, expected, data_bytes));
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const std::string& file, const std::string& json,
                                           uint64_t file_size) {
  SafetensorsHeader h;
  h.file = file;
  h.header_bytes = json.size();
  h.data_start = 8 + json.size();
  h.file_size = file_size;
  if (h.data_start > file_size) fail(file, "header runs past the end of the file");
  nlohmann::json j = parse_strict_json(json, file, "the safetensors header");
  if (!j.is_object()) fail(file, fmt::format("the header must be a JSON object, found {}", j.type_name()));

  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      parse_metadata(file, it.value(), h.metadata);
    } else {
      h.tensors.push_back(parse_tensor_entry(file, it.key(), it.value()));
    }
  }
  check_data_layout(file, h);

  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  for (size_t i = 0; i < h.tensors.size(); ++i) h.by_name_[h.tensors[i].name] = i;
  return h;
}

SafetensorsHeader parse_safetensors_buffer(const std::string& file, const uint8_t* data, size_t size) {
  if (size < 8) fail(file, fmt::format("file of {} bytes is too short for a safetensors header", size));
  const uint64_t n = check_header_length(file, data, size);
  return parse_safetensors_header(file, std::string(reinterpret_cast<const char*>(data) + 8, n), size);
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail(path, fmt::format("cannot stat: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) fail(path, fmt::format("file of {} bytes is too short for a safetensors header", size));
  uint8_t prefix[8];
  if (::pread(fd, prefix, 8, 0) != 8) fail(path, "cannot read the header length");
  const uint64_t n = check_header_length(path, prefix, size);
  std::string json(n, '\0');
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, json.data() + got, n - got, static_cast<off_t>(8 + got));
    if (r <= 0) fail(path, "cannot read the header");
    got += static_cast<uint64_t>(r);
  }
  return parse_safetensors_header(path, json, size);
}

}  // namespace tprun::checkpoint
