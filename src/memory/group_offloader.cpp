#include "memory/group_offloader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#ifdef TPRUN_TORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/torch_dtype.h"
#include "runtime/error.h"

namespace tprun::memory {
namespace {

constexpr const char* kFingerprintKey = "tprun_offload";
// XXH3-64 of the group's tensor bytes, in the order of GroupSpec::names,
// recorded when the file is written and checked whenever it is read: a file
// edited in place (same size, even the same mtime) is never trusted. XXH3
// hashes several times faster than a disk reads, so the check costs little
// next to the read it rides on.
constexpr const char* kHashKey = "tprun_xxh3";
constexpr uint64_t kVerifyChunk = 16ull << 20;

using Tensors = std::vector<at::Tensor>;

bool on_accelerator(const std::string& device) { return device.rfind("cuda", 0) == 0; }

class ContentHash {
 public:
  ContentHash() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ContentHash(const ContentHash&) = delete;
  ContentHash& operator=(const ContentHash&) = delete;
  ~ContentHash() { XXH3_freeState(state_); }
  void update(const void* data, uint64_t n) {
    if (n > 0) XXH3_64bits_update(state_, data, static_cast<size_t>(n));
  }
  std::string hex() const { return fmt::format("{:016x}", static_cast<uint64_t>(XXH3_64bits_digest(state_))); }

 private:
  XXH3_state_t* state_;
};

// A read-only descriptor, closed on every path out.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The header of the file open as `fd`: the header and the bytes read after
// it come from one file even if another run renames a new one over the path.
checkpoint::SafetensorsHeader read_header(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io_error("disk offload: cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("{}: not a regular file", path));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    throw CheckpointError(fmt::format("{}: file of {} bytes is too short for a safetensors header", path, size));
  }
  uint8_t prefix[8];
  checkpoint::pread_fully(fd, prefix, 8, 0, path);
  const uint64_t n = checkpoint::check_header_length(path, prefix, size);
  std::string json(n, '\0');
  checkpoint::pread_fully(fd, json.data(), n, 8, path);
  return checkpoint::parse_safetensors_header(path, json, size);
}

// Why the header of a group's file does not describe `spec` ("" when it does).
std::string header_mismatch(const GroupSpec& spec, const checkpoint::SafetensorsHeader& header, uint64_t* bytes) {
  auto it = header.metadata.find(kFingerprintKey);
  if (it == header.metadata.end()) return "not a tprun offload file";
  if (it->second != spec.fingerprint) return "written from other weights or settings";
  if (!header.metadata.count(kHashKey)) return "written without a content hash (an older tprun)";
  uint64_t total = 0;
  for (const auto& n : spec.names) {
    const auto* e = header.find(n);
    if (!e) return fmt::format("no tensor {}", n);
    total += e->nbytes();
  }
  if (header.tensors.size() != spec.names.size()) return "other tensors";
  *bytes = total;
  return "";
}

// Why a disk group's file cannot be reused ("" when it can): its header must
// describe the group and its bytes hash to the XXH3 recorded at write time
// (the file is read once here, sequentially, and dropped from the page cache).
std::string stale_reason(const GroupSpec& spec, uint64_t* bytes) {
  const Fd f(::open(spec.file.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    if (errno == ENOENT) return "missing";
    return fmt::format("cannot open: {}", std::strerror(errno));
  }
  try {
    const auto header = read_header(f.fd, spec.file);
    uint64_t total = 0;
    std::string why = header_mismatch(spec, header, &total);
    if (!why.empty()) return why;
    std::unique_ptr<char[]> buffer(new char[kVerifyChunk]);
    ContentHash hash;
    for (const auto& n : spec.names) {
      const auto* e = header.find(n);
      for (uint64_t done = 0; done < e->nbytes(); done += kVerifyChunk) {
        const uint64_t len = std::min(kVerifyChunk, e->nbytes() - done);
        checkpoint::pread_fully(f.fd, buffer.get(), len, header.data_start + e->begin + done, spec.file);
        hash.update(buffer.get(), len);
      }
    }
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
    if (hash.hex() != header.metadata.at(kHashKey)) {
      return "its bytes do not match the XXH3 hash recorded when it was written (changed on disk)";
    }
    *bytes = total;
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// An exclusive flock on "<group file>.lock", held while one process checks and
// writes the group's file: runs sharing the folder (dp ranks of one node,
// concurrent jobs with the same settings) write each group once; the others
// wait here, then find the finished file. Held only around one file's write,
// never across a collective, so no rank waits on a rank that waits on it.
class GroupFileLock {
 public:
  explicit GroupFileLock(const std::string& file) : path_(file + ".lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) throw_io_error("disk offload: cannot open the lock file", path_, errno);
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
        // A file system without locks: writes stay atomic (temporary file +
        // rename), runs sharing the folder may just write a group twice.
        spdlog::debug("disk offload: {}: no file locks here ({}); writing without one", path_, std::strerror(err));
        return;
      }
      ::close(fd_);
      throw_io_error("disk offload: cannot lock", path_, err);
    }
  }
  GroupFileLock(const GroupFileLock&) = delete;
  GroupFileLock& operator=(const GroupFileLock&) = delete;
  ~GroupFileLock() { ::close(fd_); }  // closing releases the lock

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

struct GroupOffloader::Impl {
  struct Group {
    GroupSpec spec;
    Tensors pending;  // Host: the stored tensors; Disk: until the file is written
    size_t received = 0;
    bool reusable = false;
    std::string stale;  // why an existing file is rewritten
    uint64_t bytes = 0;
  };

  mutable std::mutex mu;
  std::vector<std::unique_ptr<Group>> groups;
  int current = -1;
  std::shared_ptr<Tensors> onloaded;
  std::unordered_map<int, int> successor;
  int prefetch_group = -1;
  std::future<std::shared_ptr<Tensors>> prefetch;
  OffloadStats stats;

  Group& at(int g) {
    if (g < 0 || static_cast<size_t>(g) >= groups.size()) {
      throw Error(Error::Kind::Internal, fmt::format("offload group {} does not exist", g));
    }
    return *groups[static_cast<size_t>(g)];
  }

  // The group's tensors on its compute device. Reads only immutable state, so
  // it may run on the reader thread; `side`: on a CUDA side stream, synchronized
  // before returning.
  std::shared_ptr<Tensors> fetch(const Group& g, bool side) const {
    const GroupSpec& s = g.spec;
    const bool cuda = on_accelerator(s.device);
    auto out = std::make_shared<Tensors>();
    out->reserve(s.names.size());
#ifdef TPRUN_TORCH_HAS_CUDA
    std::optional<c10::cuda::CUDAStreamGuard> guard;
    if (cuda && side) {
      const auto dev = c10::Device(s.device);
      guard.emplace(c10::cuda::getStreamFromPool(false, dev.index()));
    }
#endif
    if (s.tier == Tier::Host) {
      for (const auto& t : g.pending) out->push_back(cuda ? t.to(c10::Device(s.device), /*non_blocking=*/true) : t);
    } else {
      const Fd f(::open(s.file.c_str(), O_RDONLY | O_CLOEXEC));
      if (f.fd < 0) throw_io_error(fmt::format("disk offload of {}: cannot open", s.label), s.file, errno);
      const auto header = read_header(f.fd, s.file);
      auto it = header.metadata.find(kFingerprintKey);
      if (it == header.metadata.end() || it->second != s.fingerprint) {
        throw CheckpointError(fmt::format("{}: this disk-offload file of {} was replaced by other weights while the "
                                          "run used it (two runs sharing memory.offload.disk_path with different "
                                          "models or settings?)",
                                          s.file, s.label));
      }
      ContentHash hash;
      for (const auto& name : s.names) {
        const auto* e = header.find(name);
        if (!e) throw CheckpointError(fmt::format("{}: tensor {} is missing", s.file, name));
        const auto type = checkpoint::to_torch(e->dtype);
        if (!type) throw CheckpointError(fmt::format("{}: tensor {} has a dtype libtorch cannot hold", s.file, name));
        at::Tensor host = at::empty(e->shape, at::TensorOptions().dtype(*type).pinned_memory(cuda));
        checkpoint::pread_fully(f.fd, host.data_ptr(), e->nbytes(), header.data_start + e->begin, s.file);
        hash.update(host.data_ptr(), e->nbytes());
        out->push_back(cuda ? host.to(c10::Device(s.device), /*non_blocking=*/true) : host);
      }
      ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
      auto recorded = header.metadata.find(kHashKey);
      if (recorded == header.metadata.end() || recorded->second != hash.hex()) {
        // Checked at load, so changed since: its slices are not in memory to
        // rewrite it from. The next run's load finds it stale and rewrites it.
        throw IoError(fmt::format("{}: the disk-offload file of {} changed on disk while the run used it (its "
                                  "bytes no longer match the XXH3 hash recorded when it was written); the next run "
                                  "rewrites it",
                                  s.file, s.label));
      }
    }
#ifdef TPRUN_TORCH_HAS_CUDA
    if (cuda) c10::cuda::getCurrentCUDAStream(c10::Device(s.device).index()).synchronize();
#endif
    return out;
  }

  void switch_to(int g) {
    Group& group = at(g);
    if (current >= 0) successor[current] = g;
    onloaded.reset();  // the previous group goes back before the next arrives
    current = -1;
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<Tensors> got;
    bool from_side = false;
    if (prefetch_group == g && prefetch.valid()) {
      got = prefetch.get();
      ++stats.prefetch_hits;
      from_side = true;
    } else {
      drop_prefetch();  // a misprediction: wait for the reader, drop what it read
      got = fetch(group, false);
    }
    prefetch_group = -1;
    stats.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++stats.loads;
    stats.bytes_moved += group.bytes;
#ifdef TPRUN_TORCH_HAS_CUDA
    if (from_side && on_accelerator(group.spec.device)) {
      // Made on the side stream, used on this one: keep the allocator from
      // handing the blocks to the side stream while this stream still reads them.
      const auto stream = c10::cuda::getCurrentCUDAStream(c10::Device(group.spec.device).index());
      for (auto& t : *got) t.record_stream(stream);
    }
#endif
    onloaded = std::move(got);
    current = g;
    spdlog::debug("offload: {} on the device ({})", group.spec.label, from_side ? "prefetched" : "read now");
    if (group.spec.prefetch) {
      auto it = successor.find(g);
      if (it != successor.end() && it->second != g) {
        prefetch_group = it->second;
        const Group* next = &at(it->second);
        prefetch = std::async(std::launch::async, [this, next] { return fetch(*next, true); });
      }
    }
    const uint64_t ahead = prefetch_group >= 0 ? at(prefetch_group).bytes : 0;
    stats.max_bytes_in_flight = std::max(stats.max_bytes_in_flight, group.bytes + ahead);
  }

  // Waits for a read-ahead in progress and drops what it read (or its error).
  void drop_prefetch() {
    if (prefetch.valid()) {
      try {
        prefetch.get();
      } catch (const std::exception&) {
      }
    }
    prefetch_group = -1;
  }
};

GroupOffloader& GroupOffloader::instance() {
  // Never destroyed: the tensors it may hold must not outlive libtorch's own statics.
  static GroupOffloader* offloader = new GroupOffloader();
  return *offloader;
}

GroupOffloader::GroupOffloader() : impl_(std::make_unique<Impl>()) {}
GroupOffloader::~GroupOffloader() = default;

int GroupOffloader::add_group(GroupSpec spec) {
  auto g = std::make_unique<Impl::Group>();
  g->spec = std::move(spec);
  g->pending.resize(g->spec.names.size());
  if (g->spec.tier == Tier::Disk) {
    uint64_t bytes = 0;
    g->stale = stale_reason(g->spec, &bytes);
    g->reusable = g->stale.empty();
    if (g->reusable) g->bytes = bytes;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (g->reusable) ++impl_->stats.files_reused;
  ++impl_->stats.groups;
  impl_->groups.push_back(std::move(g));
  return static_cast<int>(impl_->groups.size() - 1);
}

bool GroupOffloader::reusable(int group) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->at(group).reusable;
}

void GroupOffloader::put(int group, size_t index, const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Group& g = impl_->at(group);
  if (g.reusable || index >= g.pending.size() || g.pending[index].defined()) {
    throw Error(Error::Kind::Internal, fmt::format("offload group {}: tensor {} given twice or out of place",
                                                   g.spec.label, index));
  }
  const bool cuda = on_accelerator(g.spec.device);
  at::Tensor host = tensor.to(at::kCPU).contiguous();
  if (g.spec.tier == Tier::Host && cuda) host = host.pin_memory();
  g.bytes += static_cast<uint64_t>(host.nbytes());
  g.pending[index] = std::move(host);
  if (++g.received < g.pending.size() || g.spec.tier != Tier::Disk) return;

  std::vector<checkpoint::TensorPayload> payloads;
  for (size_t i = 0; i < g.pending.size(); ++i) {
    const at::Tensor& t = g.pending[i];
    checkpoint::TensorPayload p;
    p.name = g.spec.names[i];
    p.dtype = checkpoint::from_torch(t.scalar_type());
    p.shape = t.sizes().vec();
    p.data = t.data_ptr();
    payloads.push_back(std::move(p));
  }
  ContentHash hash;
  for (const at::Tensor& t : g.pending) hash.update(t.data_ptr(), static_cast<uint64_t>(t.nbytes()));
  const GroupFileLock file_lock(g.spec.file);
  // Another run sharing the folder may have written (or rewritten) it since
  // add_group looked: checked again under the lock.
  uint64_t on_disk = 0;
  const std::string now = stale_reason(g.spec, &on_disk);
  if (now.empty()) {
    spdlog::debug("disk offload: {} ({}) was written meanwhile by another run sharing the folder", g.spec.file,
                  g.spec.label);
    ++impl_->stats.files_shared;
  } else {
    const bool existed = now != "missing";
    if (existed) spdlog::info("disk offload: {} ({}): {}; rewriting it", g.spec.file, g.spec.label, now);
    try {
      checkpoint::write_safetensors(
          g.spec.file, std::move(payloads),
          {{kFingerprintKey, g.spec.fingerprint}, {kHashKey, hash.hex()}, {"group", g.spec.label}},
          /*overwrite=*/true);
    } catch (const CheckpointError& e) {
      // Creating, writing, syncing or renaming a file of the disk_path: an
      // I/O failure (a full disk, a quota), not a checkpoint's fault.
      throw IoError(fmt::format("disk offload of {}: {}", g.spec.label, e.what()));
    }
    ++impl_->stats.files_written;
    if (existed) ++impl_->stats.files_rewritten;
  }
  g.pending.assign(g.pending.size(), at::Tensor());  // the host copies go; the file holds them now
}

void GroupOffloader::check_complete(const std::vector<int>& groups) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (int id : groups) {
    const Impl::Group& g = impl_->at(id);
    if (!g.reusable && g.received != g.pending.size()) {
      throw Error(Error::Kind::Internal, fmt::format("offload group {}: {} of {} tensors were loaded", g.spec.label,
                                                     g.received, g.pending.size()));
    }
  }
}

at::Tensor GroupOffloader::get(int group, size_t index) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (group != impl_->current) impl_->switch_to(group);
  if (index >= impl_->onloaded->size()) {
    throw Error(Error::Kind::Internal, fmt::format("offload group {} has no tensor {}", group, index));
  }
  return (*impl_->onloaded)[index];
}

uint64_t GroupOffloader::group_bytes(int group) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->at(group).bytes;
}

OffloadStats GroupOffloader::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace tprun::memory
