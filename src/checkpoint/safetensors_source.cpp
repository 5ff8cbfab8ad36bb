#include "checkpoint/safetensors_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::checkpoint {

uint64_t StoredTensor::nbytes() const {
  uint64_t n = static_cast<uint64_t>(dtype_bits(dtype));
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return n / 8;
}

void pread_fully(int fd, void* dst, uint64_t len, uint64_t offset, const std::string& file) {
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < len) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(len - done, uint64_t{1} << 30));
    ssize_t r = ::pread(fd, out + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("{}: read of {} bytes at offset {} failed: {}", file, len, offset,
                                        std::strerror(errno)));
    }
    if (r == 0) {
      throw CheckpointError(fmt::format("{}: unexpected end of file at offset {} (file changed or truncated "
                                        "while loading?)",
                                        file, offset + done));
    }
    done += static_cast<uint64_t>(r);
  }
}

SafetensorsSource::SafetensorsSource(std::shared_ptr<const ComponentCheckpoint> checkpoint)
    : ckpt_(std::move(checkpoint)) {}

SafetensorsSource::~SafetensorsSource() { close(); }

void SafetensorsSource::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  fd_file_ = static_cast<size_t>(-1);
}

int SafetensorsSource::open_file(size_t index) {
  if (fd_file_ == index && fd_ >= 0) return fd_;
  close();  // one shard open at a time
  const std::string& file = ckpt_->files()[index].file;
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", file, std::strerror(errno)));
  fd_file_ = index;
  return fd_;
}

StoredTensor SafetensorsSource::describe(const std::string& name) const {
  const TensorLocation loc = ckpt_->locate(name);
  return {name, loc.entry->dtype, loc.entry->shape};
}

void SafetensorsSource::read_slice(const std::string& name, const ShardRequest&, const SlicePlan& plan,
                                   void* dst) {
  const TensorLocation loc = ckpt_->locate(name);
  const SafetensorsHeader& h = ckpt_->files()[loc.file];
  const int fd = open_file(loc.file);
  const uint64_t base = h.data_start + loc.entry->begin;
  auto* out = static_cast<char*>(dst);
  // One pread per merged range: colwise and replicated tensors are a single
  // read; row-wise slices one per row. (io_uring batching was measured slower
  // here, and its reads escape the /proc/self/io accounting the benchmark uses.)
  for (const ByteRange& r : plan.ranges) {
    if (r.src + r.len > loc.entry->nbytes()) {
      throw CheckpointError(fmt::format("{}: tensor '{}': slice range past the tensor's end", h.file, name));
    }
    pread_fully(fd, out + r.dst, r.len, base + r.src, h.file);
    bytes_read_ += r.len;
  }
  // A checkpoint is read once: let the kernel drop its pages now rather than
  // evict the slices it just filled (a 24 GB checkpoint on a 24 GB host
  // otherwise forces reclaim while the slices are being written).
  ::posix_fadvise(fd, static_cast<off_t>(base), static_cast<off_t>(loc.entry->nbytes()), POSIX_FADV_DONTNEED);
}

}  // namespace tprun::checkpoint
