#include "jobs/embedding_cache.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <unordered_set>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/torch_dtype.h"
#include "jobs/embedding_chunk_format.h"
#include "jobs/output_folder.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

constexpr const char* kMarkerKey = "tprun_embeddings";
constexpr const char* kMarkerValue = "2";
constexpr const char* kFingerprintKey = "fingerprint";
constexpr const char* kChunkSuffix = ".safetensors";
constexpr size_t kMaxNameBytes = 200;
constexpr int kMaxRenames = 1000;  // "<name>.bad-<n>" and "<stem>-<n>.safetensors" tried up to this n
constexpr uint64_t kReadPiece = 1ull << 20;

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

// A key for a message on one line: clipped, control characters escaped
// ("<max_sequence_length>\n<text>" shows as "512\n<text>").
std::string key_text(const std::string& key) {
  std::string out;
  for (unsigned char c : clip_text(key)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// What a directory entry that is not a regular file is, for messages.
std::string kind_of(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "a symlink (never followed)";
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (never opened)";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "a device or other special file";
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a chunk that lstat found regular, never following a symlink and never
// blocking (a FIFO swapped in meanwhile); checks it is still that file.
void open_regular(Fd& f, const std::string& path, const struct stat& want) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_ino != want.st_ino || st.st_dev != want.st_dev)
    throw CheckpointError(fmt::format("{}: changed while it was read", path));
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
  struct stat st {};
  if (err != EEXIST || ::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw_io_error("cannot create the folder", path, err);
}

// Renames an unusable chunk to "<path>.bad-<n>" (the lowest n free) with one
// warning; a chunk that cannot be moved stays, unused, with a warning.
void move_aside(const std::string& path, const std::string& why) {
  int err = EEXIST;
  for (int n = 1; n <= kMaxRenames && err == EEXIST; ++n) {
    const std::string to = fmt::format("{}.bad-{}", path, n);
    err = rename_no_replace(path, to);
    if (err == 0) {
      spdlog::warn("embedding cache: {} cannot be used ({}); moved it aside to {} (kept, never deleted) and its texts "
                   "are encoded again",
                   path, why, to);
      return;
    }
  }
  spdlog::warn("embedding cache: {} cannot be used ({}) and could not be moved aside ({}); it is not used: remove or "
               "rename it",
               path, why, std::strerror(err));
}

// The tensors of `entries` as payloads named "<i>/<name>", moved to the CPU
// and made contiguous in their own dtype (`keep` owns the bytes); `hashes`
// gets each entry's hash.
std::vector<checkpoint::TensorPayload> chunk_payloads(
    const std::vector<std::pair<std::string, models::TensorMap>>& entries, const std::string& path,
    std::vector<at::Tensor>& keep, std::vector<std::string>& hashes) {
  std::vector<checkpoint::TensorPayload> payloads;
  std::unordered_set<std::string> keys;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [key, tensors] = entries[i];
    if (!keys.insert(key).second)
      throw CheckpointError(fmt::format("{}: the key '{}' is given twice", path, key_text(key)));
    if (tensors.empty())
      throw CheckpointError(fmt::format("{}: the key '{}' has no tensors", path, key_text(key)));
    EntryHash h;
    h.field(key);
    h.number(tensors.size());
    for (const auto& [name, tensor] : tensors) {  // a std::map: sorted by name, as the reader sorts them
      if (!tensor.defined() || tensor.numel() == 0)
        throw CheckpointError(fmt::format("{}: tensor '{}' of key '{}' is {}", path, name, key_text(key),
                                          tensor.defined() ? "empty (no elements)" : "undefined"));
      keep.push_back(tensor.detach().to(at::kCPU).contiguous());
      checkpoint::TensorPayload p;
      p.name = fmt::format("{}/{}", i, name);
      p.dtype = checkpoint::from_torch(keep.back().scalar_type());
      p.shape = keep.back().sizes().vec();
      p.data = keep.back().data_ptr();
      h.tensor(name, p.dtype, p.shape, p.nbytes());
      h.raw(p.data, static_cast<size_t>(p.nbytes()));
      payloads.push_back(std::move(p));
    }
    hashes.push_back(h.hex());
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

void check_fingerprint(const std::string& fingerprint) {
  if (!plain_name(fingerprint, 128) || fingerprint.find('.') != std::string::npos) {
    throw CheckpointError(fmt::format("embedding cache: fingerprint '{}' is not a plain folder name "
                                      "(letters, digits, '-', '_')",
                                      clip_text(fingerprint)));
  }
}

// The names ending in ".safetensors" in `folder` (any kind of entry), sorted.
std::vector<std::string> list_chunks(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_chunk_name(name)) names.push_back(name);
  }
  if (ec) throw CheckpointError(fmt::format("{}: cannot list the embedding cache: {}", folder, ec.message()));
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

// One chunk file as checked: the index entries it gives.
struct EmbeddingCache::Parsed {
  ChunkFile file;
  std::vector<std::string> keys;
  std::vector<Location> locations;  // one per key; `file` set when added
};

void EmbeddingCache::check_cache_folders(const std::string& output_dir, const std::string& fingerprint) {
  const fs::path embeddings = fs::path(output_dir) / "embeddings";
  for (const fs::path& p : {embeddings, embeddings / fingerprint}) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return;  // not made yet: made as a folder on the first write
    if (S_ISLNK(st.st_mode)) {
      throw ConfigError(fmt::format("{}: is a symlink; the embedding cache is written only into a real folder inside "
                                    "the output folder, never through a link (it could lead outside): remove the "
                                    "link (the job makes the folder)",
                                    p.string()));
    }
    if (!S_ISDIR(st.st_mode)) {
      throw ConfigError(fmt::format("{}: is not a folder; the embedding cache needs this name for its folder: move "
                                    "it away",
                                    p.string()));
    }
  }
}

EmbeddingCache::Parsed EmbeddingCache::parse_file(const std::string& path, const std::string& fingerprint,
                                                  const ChunkRules& rules, bool whole) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    throw CheckpointError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("{}: {}, not a chunk file", path, kind_of(st)));
  if (st.st_size == 0) throw CheckpointError(fmt::format("{}: empty (0 bytes)", path));
  Fd f;
  open_regular(f, path, st);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) throw CheckpointError(fmt::format("{}: {} bytes, too short for a safetensors header (torn)", path, size));
  uint8_t prefix[8];
  checkpoint::pread_fully(f.fd, prefix, 8, 0, path);
  const uint64_t n = checkpoint::check_header_length(path, prefix, size);
  std::string json(n, '\0');
  checkpoint::pread_fully(f.fd, json.data(), n, 8, path);
  const checkpoint::SafetensorsHeader h = checkpoint::parse_safetensors_header(path, json, size);

  const auto meta = [&](const char* key) {
    auto it = h.metadata.find(key);
    return it == h.metadata.end() ? std::string() : it->second;
  };
  if (meta(kMarkerKey) != kMarkerValue) {
    throw CheckpointError(fmt::format("{}: not a tprun embeddings file of this version (its __metadata__ lacks "
                                      "\"{}\": \"{}\")",
                                      path, kMarkerKey, kMarkerValue));
  }
  if (meta(kFingerprintKey) != fingerprint) {
    throw CheckpointError(fmt::format("{}: holds the embeddings of fingerprint '{}', not '{}'", path,
                                      clip_text(meta(kFingerprintKey)), fingerprint));
  }
  Parsed p;
  p.file = {path, h.data_start, h.file_size, mtime_ns(st)};
  p.keys = decode_keys(meta(kKeysKey), path);
  const std::vector<std::string> hashes = decode_hashes(meta(kHashesKey), p.keys.size(), path);
  p.locations.resize(p.keys.size());
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < p.keys.size(); ++i) {
    if (!seen.insert(p.keys[i]).second)
      throw CheckpointError(fmt::format("{}: the key '{}' is listed twice", path, key_text(p.keys[i])));
    p.locations[i].hash = hashes[i];
  }
  for (const auto& entry : h.tensors) {  // sorted by name: each key's tensors sorted by name too
    if (!checkpoint::to_torch(entry.dtype)) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has the dtype {}, which libtorch cannot hold", path,
                                        entry.name, checkpoint::dtype_name(entry.dtype)));
    }
    if (entry.numel() == 0) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has the shape {}: no elements (no text tokens)", path,
                                        entry.name, checkpoint::shape_string(entry.shape)));
    }
    if (rules.float_dtype && checkpoint::dtype_is_computable(entry.dtype) && entry.dtype != *rules.float_dtype) {
      throw CheckpointError(fmt::format("{}: tensor '{}' is {}; the job computes in {}", path, entry.name,
                                        checkpoint::dtype_name(entry.dtype),
                                        checkpoint::dtype_name(*rules.float_dtype)));
    }
    auto [index, name] = split_tensor_name(entry.name, p.keys.size(), path);
    p.locations[index].tensors.push_back(entry);
    p.locations[index].tensors.back().name = std::move(name);
  }
  for (size_t i = 0; i < p.keys.size(); ++i) {
    if (p.locations[i].tensors.empty()) {
      throw CheckpointError(fmt::format("{}: {} keys but key {} has no tensors (keys and tensors do not match)",
                                        path, p.keys.size(), i));
    }
    if (rules.check_entry) {
      const std::string why = rules.check_entry(p.keys[i], p.locations[i].tensors);
      if (!why.empty()) throw CheckpointError(fmt::format("{}: key {} ('{}'): {}", path, i, key_text(p.keys[i]), why));
    }
  }
  if (!whole) return p;
  std::unique_ptr<char[]> buffer(new char[kReadPiece]);
  for (size_t i = 0; i < p.keys.size(); ++i) {
    EntryHash eh;
    eh.field(p.keys[i]);
    eh.number(p.locations[i].tensors.size());
    for (const auto& t : p.locations[i].tensors) {
      eh.tensor(t.name, t.dtype, t.shape, t.nbytes());
      for (uint64_t done = 0; done < t.nbytes();) {
        const uint64_t len = std::min(kReadPiece, t.nbytes() - done);
        checkpoint::pread_fully(f.fd, buffer.get(), len, h.data_start + t.begin + done, path);
        eh.raw(buffer.get(), static_cast<size_t>(len));
        done += len;
      }
    }
    if (eh.hex() != p.locations[i].hash) {
      throw CheckpointError(fmt::format("{}: key {} ('{}') does not match its hash (its keys, tensors or bytes were "
                                        "changed or damaged after it was written)",
                                        path, i, key_text(p.keys[i])));
    }
  }
  return p;
}

namespace {

// Of `parsed` (in order), the indices of the files sharing a key with another
// one, each with why.
template <typename P>
std::map<size_t, std::string> shared_keys(const std::vector<P>& parsed) {
  std::unordered_map<std::string, size_t> first;
  std::map<size_t, std::string> bad;
  for (size_t f = 0; f < parsed.size(); ++f) {
    for (const auto& key : parsed[f].keys) {
      const auto [it, fresh] = first.emplace(key, f);
      if (fresh || it->second == f) continue;
      const std::string why = fmt::format("the key '{}' is in both {} and {}; neither is trusted", key_text(key),
                                          parsed[it->second].file.path, parsed[f].file.path);
      bad.emplace(it->second, why);
      bad.emplace(f, why);
    }
  }
  return bad;
}

}  // namespace

EmbeddingCache::EmbeddingCache(const std::string& output_dir, const std::string& fingerprint, ChunkRules rules)
    : output_dir_(output_dir), fingerprint_(fingerprint), rules_(std::move(rules)) {
  check_fingerprint(fingerprint);
  folder_ = (fs::path(output_dir) / "embeddings" / fingerprint).string();
  check_cache_folders(output_dir, fingerprint);
  std::error_code ec;
  if (!fs::is_directory(folder_, ec)) return;
  std::vector<Parsed> parsed;
  for (const auto& name : list_chunks(folder_)) {
    const std::string path = (fs::path(folder_) / name).string();
    try {
      parsed.push_back(parse_file(path, fingerprint_, rules_, /*whole=*/false));
    } catch (const Error& e) {
      spdlog::warn("embedding cache: skipping {} (kept on disk, not used): {}", path, e.what());
    }
  }
  const std::map<size_t, std::string> bad = shared_keys(parsed);
  for (size_t f = 0; f < parsed.size(); ++f) {
    if (bad.count(f) == 0) {
      add(std::move(parsed[f]));
    } else {
      spdlog::warn("embedding cache: skipping {} (kept on disk, not used): {}", parsed[f].file.path, bad.at(f));
    }
  }
}

EmbeddingCache::EmbeddingCache(const std::string& output_dir, const std::string& fingerprint, ChunkRules rules,
                               const std::vector<std::string>& names)
    : output_dir_(output_dir), fingerprint_(fingerprint), rules_(std::move(rules)) {
  check_fingerprint(fingerprint);
  folder_ = (fs::path(output_dir) / "embeddings" / fingerprint).string();
  for (const auto& name : names) index_chunk(name);
}

std::vector<std::string> EmbeddingCache::sweep(const std::string& output_dir, const std::string& fingerprint,
                                               const ChunkRules& rules) {
  check_fingerprint(fingerprint);
  check_cache_folders(output_dir, fingerprint);
  const std::string folder = (fs::path(output_dir) / "embeddings" / fingerprint).string();
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return {};
  struct Checked {
    std::string name;
    ChunkFile file;
    std::vector<std::string> keys;
  };
  std::vector<Checked> good;
  for (const auto& name : list_chunks(folder)) {
    const std::string path = (fs::path(folder) / name).string();
    try {
      Parsed p = parse_file(path, fingerprint, rules, /*whole=*/true);
      good.push_back({name, std::move(p.file), std::move(p.keys)});
    } catch (const Error& e) {
      std::string why = e.what();
      if (why.rfind(path + ": ", 0) == 0) why = why.substr(path.size() + 2);
      move_aside(path, why);
    }
  }
  const std::map<size_t, std::string> bad = shared_keys(good);
  std::vector<std::string> names;
  for (size_t f = 0; f < good.size(); ++f) {
    if (bad.count(f) != 0) {
      move_aside(good[f].file.path, bad.at(f));
    } else {
      names.push_back(good[f].name);
    }
  }
  return names;
}

void EmbeddingCache::add(Parsed&& parsed) {
  files_.push_back(std::move(parsed.file));
  for (size_t i = 0; i < parsed.keys.size(); ++i) {
    parsed.locations[i].file = files_.size() - 1;
    index_.emplace(parsed.keys[i], std::move(parsed.locations[i]));
  }
}

void EmbeddingCache::index_chunk(const std::string& name) {
  check_chunk_name(name);
  add(parse_file((fs::path(folder_) / name).string(), fingerprint_, rules_, /*whole=*/false));
}

bool EmbeddingCache::contains(const std::string& key) const { return index_.count(key) != 0; }

models::TensorMap EmbeddingCache::get(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end())
    throw CheckpointError(fmt::format("{}: no embeddings stored for the key '{}'", folder_, key_text(key)));
  const ChunkFile& file = files_[it->second.file];
  const std::string fix = "move it aside (rename it) and rerun: the rerun encodes its texts again";
  Fd f;
  f.fd = ::open(file.path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", file.path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != file.file_size ||
      mtime_ns(st) != file.mtime_ns)
    throw CheckpointError(fmt::format("{}: changed since the embedding cache indexed it; {}", file.path, fix));
  EntryHash h;
  h.field(key);
  h.number(it->second.tensors.size());
  models::TensorMap out;
  for (const auto& entry : it->second.tensors) {
    at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(*checkpoint::to_torch(entry.dtype)));
    checkpoint::pread_fully(f.fd, t.data_ptr(), entry.nbytes(), file.data_start + entry.begin, file.path);
    h.tensor(entry.name, entry.dtype, entry.shape, entry.nbytes());
    h.raw(t.data_ptr(), static_cast<size_t>(entry.nbytes()));
    out.emplace(entry.name, std::move(t));
  }
  if (h.hex() != it->second.hash) {
    throw CheckpointError(fmt::format("{}: the embeddings of '{}' do not match their hash (changed or damaged after "
                                      "they were written); {}",
                                      file.path, key_text(key), fix));
  }
  return out;
}

void EmbeddingCache::make_folder() const {
  std::error_code ec;
  if (!fs::is_directory(output_dir_, ec)) throw_io_error("embedding cache: no output folder", output_dir_, ENOENT);
  check_cache_folders(output_dir_, fingerprint_);
  const std::string embeddings = (fs::path(output_dir_) / "embeddings").string();
  make_dir(embeddings, output_dir_);
  make_dir(folder_, embeddings);
  check_cache_folders(output_dir_, fingerprint_);
}

std::string EmbeddingCache::write_chunk(const std::string& name,
                                        const std::vector<std::pair<std::string, models::TensorMap>>& entries) {
  check_chunk_name(name);
  const std::string first_path = (fs::path(folder_) / name).string();
  if (entries.empty()) return "";
  std::vector<at::Tensor> keep;
  std::vector<std::string> hashes;
  std::vector<checkpoint::TensorPayload> payloads = chunk_payloads(entries, first_path, keep, hashes);
  const std::map<std::string, std::string> metadata = {{kMarkerKey, kMarkerValue},
                                                       {kFingerprintKey, fingerprint_},
                                                       {kKeysKey, encode_keys(entries)},
                                                       {kHashesKey, nlohmann::json(hashes).dump()}};
  check_header_size(payloads, metadata, first_path);
  make_folder();
  const std::string tmp = (fs::path(folder_) / ("." + name + ".tmp")).string();
  const std::string stem = name.substr(0, name.size() - std::strlen(kChunkSuffix));
  std::string written;
  try {
    checkpoint::write_safetensors(tmp, std::move(payloads), metadata, /*overwrite=*/true);
    int err = EEXIST;
    for (int n = 0; n <= kMaxRenames && err == EEXIST; ++n) {
      written = n == 0 ? name : fmt::format("{}-{}{}", stem, n, kChunkSuffix);
      err = rename_no_replace(tmp, (fs::path(folder_) / written).string());
    }
    if (err != 0) throw_io_error("cannot rename " + tmp + " to", (fs::path(folder_) / written).string(), err);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (written != name) {
    spdlog::warn("embedding cache: {} exists (never replaced); wrote this chunk as {}", first_path, written);
  }
  fsync_folder(folder_);
  index_chunk(written);
  return written;
}

}  // namespace tprun::jobs
