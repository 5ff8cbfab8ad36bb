#include "checkpoint/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_source.h"
#include "runtime/error.h"

namespace tprun::checkpoint {
namespace {

constexpr uint64_t kCopyChunk = 16ull << 20;

void write_all(int fd, const void* data, uint64_t len, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t w = ::write(fd, p, static_cast<size_t>(std::min<uint64_t>(len, 1ull << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
    }
    p += w;
    len -= static_cast<uint64_t>(w);
  }
}

// A temporary file next to `path` (a fresh name: mkstemp's O_CREAT | O_EXCL
// never follows a symlink planted at a predictable name), renamed over it on
// commit (without `overwrite`: only where nothing is, RENAME_NOREPLACE),
// removed otherwise.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, bool overwrite) : path_(path), overwrite_(overwrite) {
    std::error_code ec;
    if (!overwrite && std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
      throw CheckpointError(fmt::format("{}: already exists (pass --force to overwrite)", path));
    tmp_ = path + ".tmp-XXXXXX";
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) throw CheckpointError(fmt::format("{}: cannot create: {}", tmp_, std::strerror(errno)));
    ::fchmod(fd_, 0644);
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  int fd() const { return fd_; }
  void commit() {
    if (::fsync(fd_) != 0) throw CheckpointError(fmt::format("{}: fsync failed: {}", tmp_, std::strerror(errno)));
    ::close(fd_);
    fd_ = -1;
    int rc = overwrite_ ? ::rename(tmp_.c_str(), path_.c_str())
                        : ::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && !overwrite_ && (errno == EINVAL || errno == ENOSYS)) {  // link(2) refuses an existing name too
      rc = ::link(tmp_.c_str(), path_.c_str());
      if (rc == 0) ::unlink(tmp_.c_str());
    }
    if (rc != 0 && errno == EEXIST)
      throw CheckpointError(fmt::format("{}: already exists (pass --force to overwrite)", path_));
    if (rc != 0) throw CheckpointError(fmt::format("{}: rename failed: {}", path_, std::strerror(errno)));
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  bool overwrite_ = false;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

uint64_t TensorPayload::nbytes() const {
  uint64_t bits = static_cast<uint64_t>(dtype_bits(dtype));
  for (auto d : shape) bits *= static_cast<uint64_t>(d);
  return bits / 8;
}

void write_file_atomically(const std::string& path, const std::string& contents, bool overwrite) {
  AtomicFile f(path, overwrite);
  write_all(f.fd(), contents.data(), contents.size(), path);
  f.commit();
}

void write_safetensors(const std::string& path, std::vector<TensorPayload> tensors,
                       const std::map<std::string, std::string>& metadata, bool overwrite) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorPayload& a, const TensorPayload& b) {
    const int wa = dtype_bits(a.dtype), wb = dtype_bits(b.dtype);
    return wa != wb ? wa > wb : a.name < b.name;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (header.contains(t.name)) throw CheckpointError(fmt::format("{}: tensor '{}' given twice", path, t.name));
    const uint64_t n = t.nbytes();
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  AtomicFile f(path, overwrite);
  uint8_t prefix[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(len >> (8 * i));
  write_all(f.fd(), prefix, 8, path);
  write_all(f.fd(), text.data(), text.size(), path);
  std::unique_ptr<char[]> buffer;
  int src_fd = -1;
  std::string src_name;
  for (const auto& t : tensors) {
    const uint64_t n = t.nbytes();
    if (t.data != nullptr || n == 0) {
      write_all(f.fd(), t.data, n, path);
      continue;
    }
    if (t.src_file.empty()) throw CheckpointError(fmt::format("{}: tensor '{}' has no data", path, t.name));
    if (t.src_file != src_name) {
      if (src_fd >= 0) ::close(src_fd);
      src_fd = ::open(t.src_file.c_str(), O_RDONLY | O_CLOEXEC);
      if (src_fd < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", t.src_file, std::strerror(errno)));
      src_name = t.src_file;
    }
    if (!buffer) buffer.reset(new char[kCopyChunk]);
    for (uint64_t done = 0; done < n; done += kCopyChunk) {
      const uint64_t len = std::min(kCopyChunk, n - done);
      try {
        pread_fully(src_fd, buffer.get(), len, t.src_offset + done, t.src_file);
      } catch (...) {
        ::close(src_fd);
        throw;
      }
      write_all(f.fd(), buffer.get(), len, path);
    }
  }
  if (src_fd >= 0) ::close(src_fd);
  f.commit();
}

}  // namespace tprun::checkpoint
