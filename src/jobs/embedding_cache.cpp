#include "jobs/embedding_cache.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/strict_json.h"
#include "checkpoint/torch_dtype.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

constexpr const char* kMarkerKey = "tprun_embeddings";
constexpr const char* kMarkerValue = "1";
constexpr const char* kFingerprintKey = "fingerprint";
constexpr const char* kKeysKey = "keys";
constexpr const char* kChunkSuffix = ".safetensors";
constexpr size_t kMaxNameBytes = 200;

bool plain_name(const std::string& s, size_t max_bytes) {
  if (s.empty() || s.size() > max_bytes || s[0] == '.') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_';
  });
}

bool is_chunk_name(const std::string& name) {
  const size_t n = std::strlen(kChunkSuffix);
  return name.size() > n && name[0] != '.' && name.compare(name.size() - n, n, kChunkSuffix) == 0;
}

std::string to_hex(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The keys as a JSON array: a string for a UTF-8 key, {"hex": ...} otherwise
// (JSON strings hold only UTF-8).
std::string encode_keys(const std::vector<std::pair<std::string, models::TensorMap>>& entries) {
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& [key, tensors] : entries) {
    nlohmann::json k = key;
    try {
      (void)k.dump();
    } catch (const nlohmann::json::type_error&) {
      k = {{"hex", to_hex(key)}};
    }
    keys.push_back(std::move(k));
  }
  return keys.dump();
}

std::vector<std::string> decode_keys(const std::string& text, const std::string& file) {
  const nlohmann::json keys = checkpoint::parse_strict_json(text, file, "the embedding keys");
  if (!keys.is_array()) throw CheckpointError(fmt::format("{}: __metadata__ '{}' is not a JSON array", file, kKeysKey));
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    if (k.is_string()) {
      out.push_back(k.get<std::string>());
      continue;
    }
    const bool hex_object = k.is_object() && k.size() == 1 && k.contains("hex") && k["hex"].is_string();
    const std::string hex = hex_object ? k["hex"].get<std::string>() : std::string("?");
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size() && hex.size() % 2 == 0; i += 2) {
      const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
      if (hi < 0 || lo < 0) break;
      bytes.push_back(static_cast<char>(hi * 16 + lo));
    }
    if (bytes.size() * 2 != hex.size()) {
      throw CheckpointError(fmt::format("{}: key {} is neither a string nor {{\"hex\": \"<lowercase hex>\"}}", file,
                                        out.size()));
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

// "<i>/<name>" -> (i, name); CheckpointError unless i is a key's index.
std::pair<size_t, std::string> split_tensor_name(const std::string& tensor, size_t keys, const std::string& file) {
  const size_t slash = tensor.find('/');
  const std::string digits = tensor.substr(0, slash);
  const bool number = slash != std::string::npos && !digits.empty() && digits.size() <= 9 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                      (digits == "0" || digits[0] != '0');
  const size_t index = number ? std::stoul(digits) : keys;
  if (index >= keys) {
    throw CheckpointError(fmt::format("{}: tensor '{}' is not '<key index>/<name>' for one of its {} keys", file,
                                      clip_text(tensor), keys));
  }
  return {index, tensor.substr(slash + 1)};
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void fsync_folder(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error("cannot open the folder to sync it", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_io_error("cannot sync the folder", path, err);
}

// mkdir `path` unless it is a folder already; a new one is made durable in `parent`.
void make_dir(const std::string& path, const std::string& parent) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    fsync_folder(parent);
    return;
  }
  const int err = errno;
  std::error_code ec;
  if (err != EEXIST || !fs::is_directory(path, ec)) throw_io_error("cannot create the folder", path, err);
}

// rename(2) that never replaces `to`.
void rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  int err = errno;
  if (err == EINVAL || err == ENOSYS) {  // a file system without RENAME_NOREPLACE: link(2) refuses an existing name too
    if (::link(from.c_str(), to.c_str()) == 0) {
      ::unlink(from.c_str());
      return;
    }
    err = errno;
  }
  if (err == EEXIST) throw CheckpointError(fmt::format("{}: already exists; a chunk file is never replaced", to));
  throw_io_error("cannot rename " + from + " to", to, err);
}

// The tensors of `entries` as payloads named "<i>/<name>", moved to the CPU
// and made contiguous in their own dtype (`keep` owns the bytes).
std::vector<checkpoint::TensorPayload> chunk_payloads(
    const std::vector<std::pair<std::string, models::TensorMap>>& entries, const std::string& path,
    std::vector<at::Tensor>& keep) {
  std::vector<checkpoint::TensorPayload> payloads;
  std::unordered_set<std::string> keys;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [key, tensors] = entries[i];
    if (!keys.insert(key).second)
      throw CheckpointError(fmt::format("{}: the key '{}' is given twice", path, clip_text(key)));
    if (tensors.empty())
      throw CheckpointError(fmt::format("{}: the key '{}' has no tensors", path, clip_text(key)));
    for (const auto& [name, tensor] : tensors) {
      if (!tensor.defined())
        throw CheckpointError(fmt::format("{}: tensor '{}' of key '{}' is undefined", path, name, clip_text(key)));
      keep.push_back(tensor.detach().to(at::kCPU).contiguous());
      checkpoint::TensorPayload p;
      p.name = fmt::format("{}/{}", i, name);
      p.dtype = checkpoint::from_torch(keep.back().scalar_type());
      p.shape = keep.back().sizes().vec();
      p.data = keep.back().data_ptr();
      payloads.push_back(std::move(p));
    }
  }
  return payloads;
}

// Refuses a chunk whose header the reader would refuse (kMaxHeaderBytes),
// from an upper bound of the header's size.
void check_header_size(const std::vector<checkpoint::TensorPayload>& payloads,
                       const std::map<std::string, std::string>& metadata, const std::string& path) {
  uint64_t bytes = nlohmann::json{{"__metadata__", metadata}}.dump().size();
  for (const auto& p : payloads) {
    // {"name":{"dtype":"BF16","shape":[..],"data_offsets":[a,b]}}: at most 21 bytes a number
    bytes += nlohmann::json(p.name).dump().size() + 64 + 21 * (p.shape.size() + 2);
  }
  if (bytes > checkpoint::kMaxHeaderBytes) {
    throw CheckpointError(fmt::format("{}: the chunk's header would take up to {} bytes, over the reader's limit "
                                      "of {}; write fewer or shorter keys per chunk",
                                      path, bytes, checkpoint::kMaxHeaderBytes));
  }
}

// CheckpointError unless `name` is a plain chunk file name.
void check_chunk_name(const std::string& name) {
  if (!plain_name(name, kMaxNameBytes) || !is_chunk_name(name)) {
    throw CheckpointError(fmt::format("embedding cache: chunk name '{}' is not a plain file name "
                                      "(letters, digits, '.', '-', '_'; not starting with '.') ending in '{}'",
                                      clip_text(name), kChunkSuffix));
  }
}

}  // namespace

EmbeddingCache::EmbeddingCache(const std::string& output_dir, const std::string& fingerprint)
    : output_dir_(output_dir), fingerprint_(fingerprint) {
  if (!plain_name(fingerprint, 128) || fingerprint.find('.') != std::string::npos) {
    throw CheckpointError(fmt::format("embedding cache: fingerprint '{}' is not a plain folder name "
                                      "(letters, digits, '-', '_')",
                                      clip_text(fingerprint)));
  }
  folder_ = (fs::path(output_dir) / "embeddings" / fingerprint).string();
  std::error_code ec;
  if (!fs::is_directory(folder_, ec)) return;
  std::vector<std::string> names;
  for (fs::directory_iterator it(folder_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_chunk_name(name)) names.push_back(name);
  }
  if (ec) throw CheckpointError(fmt::format("{}: cannot list the embedding cache: {}", folder_, ec.message()));
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    const std::string path = (fs::path(folder_) / name).string();
    try {
      index_file(path);
    } catch (const Error& e) {
      spdlog::warn("embedding cache: skipping {} (kept on disk, not used): {}", path, e.what());
    }
  }
}

void EmbeddingCache::index_file(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    throw CheckpointError(fmt::format("{}: not a regular file", path));
  const checkpoint::SafetensorsHeader h = checkpoint::read_safetensors_header(path);
  const auto meta = [&](const char* key) {
    auto it = h.metadata.find(key);
    return it == h.metadata.end() ? std::string() : it->second;
  };
  if (meta(kMarkerKey) != kMarkerValue) {
    throw CheckpointError(fmt::format("{}: not a tprun embeddings file (its __metadata__ lacks \"{}\": \"{}\")",
                                      path, kMarkerKey, kMarkerValue));
  }
  if (meta(kFingerprintKey) != fingerprint_) {
    throw CheckpointError(fmt::format("{}: holds the embeddings of fingerprint '{}', not '{}'", path,
                                      clip_text(meta(kFingerprintKey)), fingerprint_));
  }
  const std::vector<std::string> keys = decode_keys(meta(kKeysKey), path);
  std::vector<std::vector<checkpoint::TensorEntry>> tensors(keys.size());
  for (const auto& entry : h.tensors) {
    if (!checkpoint::to_torch(entry.dtype)) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has the dtype {}, which libtorch cannot hold", path,
                                        entry.name, checkpoint::dtype_name(entry.dtype)));
    }
    auto [index, name] = split_tensor_name(entry.name, keys.size(), path);
    tensors[index].push_back(entry);
    tensors[index].back().name = std::move(name);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (tensors[i].empty()) {
      throw CheckpointError(fmt::format("{}: {} keys but key {} has no tensors (keys and tensors do not match)",
                                        path, keys.size(), i));
    }
  }
  files_.push_back({path, h.data_start, h.file_size, mtime_ns(st)});
  for (size_t i = 0; i < keys.size(); ++i) index_.emplace(keys[i], Location{files_.size() - 1, std::move(tensors[i])});
}

void EmbeddingCache::index_chunk(const std::string& name) {
  check_chunk_name(name);
  index_file((fs::path(folder_) / name).string());
}

bool EmbeddingCache::contains(const std::string& key) const { return index_.count(key) != 0; }

models::TensorMap EmbeddingCache::get(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end())
    throw CheckpointError(fmt::format("{}: no embeddings stored for the key '{}'", folder_, clip_text(key)));
  const ChunkFile& file = files_[it->second.file];
  const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", file.path, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file.file_size || mtime_ns(st) != file.mtime_ns)
    throw CheckpointError(fmt::format("{}: changed since the embedding cache indexed it", file.path));
  models::TensorMap out;
  for (const auto& entry : it->second.tensors) {
    at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(*checkpoint::to_torch(entry.dtype)));
    checkpoint::pread_fully(fd, t.data_ptr(), entry.nbytes(), file.data_start + entry.begin, file.path);
    out.emplace(entry.name, std::move(t));
  }
  return out;
}

void EmbeddingCache::make_folder() const {
  std::error_code ec;
  if (!fs::is_directory(output_dir_, ec)) throw_io_error("embedding cache: no output folder", output_dir_, ENOENT);
  const std::string embeddings = (fs::path(output_dir_) / "embeddings").string();
  make_dir(embeddings, output_dir_);
  make_dir(folder_, embeddings);
}

void EmbeddingCache::write_chunk(const std::string& name,
                                 const std::vector<std::pair<std::string, models::TensorMap>>& entries) {
  const std::string path = (fs::path(folder_) / name).string();
  check_chunk_name(name);
  if (entries.empty()) return;
  std::vector<at::Tensor> keep;
  std::vector<checkpoint::TensorPayload> payloads = chunk_payloads(entries, path, keep);
  const std::map<std::string, std::string> metadata = {
      {kMarkerKey, kMarkerValue}, {kFingerprintKey, fingerprint_}, {kKeysKey, encode_keys(entries)}};
  check_header_size(payloads, metadata, path);
  make_folder();
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec)))
    throw CheckpointError(fmt::format("{}: already exists; a chunk file is never replaced", path));
  const std::string tmp = (fs::path(folder_) / ("." + name + ".tmp")).string();
  try {
    checkpoint::write_safetensors(tmp, std::move(payloads), metadata, /*overwrite=*/true);
    rename_no_replace(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_folder(folder_);
  index_file(path);
}

}  // namespace tprun::jobs
