#include "memory/group_offloader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

using Tensors = std::vector<at::Tensor>;

bool on_accelerator(const std::string& device) { return device.rfind("cuda", 0) == 0; }

// Why a disk group's file cannot be reused ("" when it can).
std::string stale_reason(const GroupSpec& spec, uint64_t* bytes) {
  std::error_code ec;
  if (!std::filesystem::exists(spec.file, ec)) return "missing";
  try {
    const auto header = checkpoint::read_safetensors_header(spec.file);
    auto it = header.metadata.find(kFingerprintKey);
    if (it == header.metadata.end()) return "not a tprun offload file";
    if (it->second != spec.fingerprint) return "written from other weights or settings";
    uint64_t total = 0;
    for (const auto& n : spec.names) {
      const auto* e = header.find(n);
      if (!e) return fmt::format("no tensor {}", n);
      total += e->nbytes();
    }
    if (header.tensors.size() != spec.names.size()) return "other tensors";
    *bytes = total;
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

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
      const auto header = checkpoint::read_safetensors_header(s.file);
      auto it = header.metadata.find(kFingerprintKey);
      if (it == header.metadata.end() || it->second != s.fingerprint) {
        throw CheckpointError(fmt::format("{}: this disk-offload file of {} was replaced by other weights while the "
                                          "run used it (two runs sharing memory.offload.disk_path with different "
                                          "models or settings?)",
                                          s.file, s.label));
      }
      const int fd = ::open(s.file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", s.file, std::strerror(errno)));
      try {
        for (const auto& name : s.names) {
          const auto* e = header.find(name);
          if (!e) throw CheckpointError(fmt::format("{}: tensor {} is missing", s.file, name));
          const auto type = checkpoint::to_torch(e->dtype);
          if (!type) throw CheckpointError(fmt::format("{}: tensor {} has a dtype libtorch cannot hold", s.file, name));
          at::Tensor host = at::empty(e->shape, at::TensorOptions().dtype(*type).pinned_memory(cuda));
          checkpoint::pread_fully(fd, host.data_ptr(), e->nbytes(), header.data_start + e->begin, s.file);
          out->push_back(cuda ? host.to(c10::Device(s.device), /*non_blocking=*/true) : host);
        }
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
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
  const bool existed = g.stale != "missing";
  if (existed) spdlog::info("disk offload: {} ({}): {}; rewriting it", g.spec.file, g.spec.label, g.stale);
  checkpoint::write_safetensors(g.spec.file, std::move(payloads),
                                {{kFingerprintKey, g.spec.fingerprint}, {"group", g.spec.label}}, /*overwrite=*/true);
  g.pending.assign(g.pending.size(), at::Tensor());  // the host copies go; the file holds them now
  ++impl_->stats.files_written;
  if (existed) ++impl_->stats.files_rewritten;
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
