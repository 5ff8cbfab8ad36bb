#include "checkpoint/shard_loader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <numeric>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/cuda_copy_engine.h"
#include "checkpoint/pinned_staging.h"
#include "checkpoint/torch_dtype.h"
#include "runtime/error.h"
#include "runtime/size_string.h"

namespace tprun::checkpoint {
namespace {

c10::ScalarType stored_type(const StoredTensor& info, const std::string& path) {
  auto t = to_torch(info.dtype);
  if (!t) {
    throw CheckpointError(fmt::format("{}: tensor '{}' is stored as {}, which tprun cannot load (no libtorch "
                                      "type); re-save it as BF16, F16 or F32",
                                      path, info.name, dtype_name(info.dtype)));
  }
  return *t;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

// One host buffer for every converted slice of a load: an anonymous mapping
// of its own, replaced by a larger one when a larger slice comes (the old one
// unmapped at once) and unmapped with the loader, so its bytes never become
// free heap chunks that stay resident.
class ShardLoader::Staging {
 public:
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() { unmap(); }

  // At least `bytes` (page-aligned); the contents are not kept across calls.
  char* reserve(size_t bytes) {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    bytes = round_up(std::max<size_t>(bytes, 1), page);
    if (bytes > size_) {
      unmap();
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<char*>(p);
      size_ = bytes;
    }
    return data_;
  }

 private:
  void unmap() {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  char* data_ = nullptr;
  size_t size_ = 0;
};

ShardLoader::ShardLoader(WeightSource& source, LoadOptions options)
    : source_(source), options_(std::move(options)), staging_(std::make_unique<Staging>()) {
  if (!options_.dtype.empty()) parse_compute_dtype(options_.dtype, "dtype");
  (void)c10::Device(options_.device);  // validates the device string
}

ShardLoader::~ShardLoader() {
  if (!uploads_) return;
  const StagingStats& st = uploads_->stats();
  spdlog::debug("{}: staged {} slices ({}) to {} through {} pinned buffers: {} allocations, peak {} pinned",
                source_.path(), st.slices, format_size(st.bytes), options_.device, uploads_->buffers(),
                st.buffers_allocated, format_size(st.peak_staging_bytes));
  uploads_.reset();  // waits for the copies still in flight
}

c10::ScalarType ShardLoader::compute_type(const std::string& name, const StoredTensor& info,
                                          const std::string& dtype) const {
  const c10::ScalarType stored = stored_type(info, source_.path());
  if (dtype.empty()) return stored;
  const c10::ScalarType target = parse_compute_dtype(dtype, "dtype");
  if (stored != target && !dtype_is_computable(info.dtype)) {
    throw CheckpointError(fmt::format("{}: tensor '{}' is stored as {}, which tprun cannot compute with "
                                      "(expected a floating-point weight: F32, BF16, F16 or F8)",
                                      source_.path(), name, dtype_name(info.dtype)));
  }
  return target;
}

at::Tensor ShardLoader::finish(at::Tensor host, const std::string& name, const StoredTensor& info,
                               const std::string& dtype) {
  const c10::ScalarType target = dtype.empty() ? host.scalar_type() : compute_type(name, info, dtype);
  const c10::Device device(options_.device);
  if (device.is_cpu()) return host.scalar_type() == target ? host : host.to(target);
  // Host slice -> device, converted there.
  return host.to(device, /*non_blocking=*/false).to(target);
}

at::Tensor ShardLoader::read_whole(const std::string& name) {
  const StoredTensor info = source_.describe(name);
  ShardRequest whole;
  const SlicePlan plan = plan_slice(name, info.shape, dtype_bits(info.dtype), whole);
  at::Tensor host = at::empty(info.shape, at::TensorOptions().dtype(stored_type(info, source_.path())));
  source_.read_slice(name, whole, plan, host.data_ptr());
  return host;
}

at::Tensor ShardLoader::load(const std::string& name, const ShardRequest& request) {
  return load_as(name, request, options_.dtype);
}

at::Tensor ShardLoader::load_as(const std::string& name, const ShardRequest& request, const std::string& dtype) {
  return load_kept(name, request, dtype, c10::ScalarType::Undefined);
}

at::Tensor ShardLoader::load_cast(const std::string& name, const ShardRequest& request, c10::ScalarType storage) {
  return load_kept(name, request, options_.dtype, storage);
}

at::Tensor ShardLoader::load_kept(const std::string& name, const ShardRequest& request, const std::string& dtype,
                                  c10::ScalarType storage) {
  if (!dtype.empty()) parse_compute_dtype(dtype, "dtype");
  const StoredTensor info = source_.describe(name);
  const bool cast = storage != c10::ScalarType::Undefined;
  if (options_.mode == LoadMode::LoadThenShard) {
    at::Tensor full = read_whole(name);
    at::Tensor part = slice_in_memory(full, name, request);
    // A view would keep the whole tensor alive: copy the slice out.
    if (part.data_ptr() != full.data_ptr() || part.numel() != full.numel())
      part = part.clone(at::MemoryFormat::Contiguous);
    at::Tensor t = finish(part, name, info, dtype);
    return cast ? t.to(storage) : t;
  }
  const SlicePlan plan = plan_slice(name, info.shape, dtype_bits(info.dtype), request);
  const c10::Device device(options_.device);
  const c10::ScalarType stored = stored_type(info, source_.path());
  if (device.is_cpu()) {
    const c10::ScalarType compute = compute_type(name, info, dtype);
    const c10::ScalarType kept = cast ? storage : compute;
    if (stored != compute || kept != compute) return load_staged(name, request, plan, stored, compute, kept);
  }
  if (device.is_cuda()) {
    const c10::ScalarType compute = compute_type(name, info, dtype);
    // The conversions finish() makes on the host's copy, made on the device.
    at::Tensor t = upload_slice(name, request, plan, stored);
    if (t.scalar_type() != compute) t = t.to(compute);
    return cast ? t.to(storage) : t;
  }
  at::Tensor host = at::empty(plan.shape, at::TensorOptions().dtype(stored));
  source_.read_slice(name, request, plan, host.data_ptr());
  at::Tensor t = finish(host, name, info, dtype);
  return cast ? t.to(storage) : t;
}

at::Tensor ShardLoader::upload_slice(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                                     c10::ScalarType stored) {
  const c10::Device device(options_.device);
  if (!uploads_) uploads_ = std::make_unique<StagingPipeline>(make_cuda_copy_engine(device.index()));
  at::Tensor out = at::empty(plan.shape, at::TensorOptions().dtype(stored).device(device));
  if (static_cast<uint64_t>(out.nbytes()) != plan.bytes) {
    throw Error(Error::Kind::Internal, fmt::format("{}: tensor '{}': slice plan of {} bytes for a {}-byte tensor",
                                                   source_.path(), name, plan.bytes, out.nbytes()));
  }
  uploads_->upload(name, out.data_ptr(), plan.bytes,
                   [&](void* host) { source_.read_slice(name, request, plan, host); });
  return out;
}

at::Tensor ShardLoader::load_staged(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                                    c10::ScalarType stored, c10::ScalarType compute, c10::ScalarType kept) {
  // The conversions a load without staging makes (host.to(compute), then
  // .to(kept)), each a copy_ as Tensor::to is, so the kept values are the same:
  // stored -> compute in the buffer's second part where neither end is it.
  const bool via_compute = stored != compute && compute != kept;
  const size_t read_bytes = round_up(plan.bytes, 64);
  int64_t numel = 1;
  for (int64_t d : plan.shape) numel *= d;
  const size_t compute_bytes = via_compute ? static_cast<size_t>(numel) * c10::elementSize(compute) : 0;
  char* buffer = staging_->reserve(read_bytes + compute_bytes);
  source_.read_slice(name, request, plan, buffer);
  at::Tensor from = at::from_blob(buffer, plan.shape, at::TensorOptions().dtype(stored));
  if (via_compute) {
    at::Tensor in_compute = at::from_blob(buffer + read_bytes, plan.shape, at::TensorOptions().dtype(compute));
    in_compute.copy_(from);
    from = in_compute;
  }
  at::Tensor out = at::empty(plan.shape, at::TensorOptions().dtype(kept));
  out.copy_(from);
  return out;
}

std::vector<at::Tensor> ShardLoader::load_many(const std::vector<LoadItem>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::vector<size_t> file(items.size());
  for (size_t i = 0; i < items.size(); ++i) file[i] = source_.file_of(items[i].name);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return file[a] < file[b]; });
  std::vector<at::Tensor> out(items.size());
  if (options_.mode == LoadMode::LoadThenShard) {
    // The whole state dict first, as a load-then-shard framework holds it.
    std::vector<at::Tensor> full(items.size());
    for (size_t i : order) full[i] = read_whole(items[i].name);
    source_.close();
    for (size_t i : order) {
      const StoredTensor info = source_.describe(items[i].name);
      at::Tensor part = slice_in_memory(full[i], items[i].name, items[i].request);
      if (part.data_ptr() != full[i].data_ptr() || part.numel() != full[i].numel())
        part = part.clone(at::MemoryFormat::Contiguous);
      out[i] = finish(part, items[i].name, info, options_.dtype);
      full[i] = at::Tensor();
    }
    return out;
  }
  for (size_t i : order) out[i] = load(items[i].name, items[i].request);
  // A copy that failed on the device is reported here, naming its tensor.
  if (uploads_) uploads_->finish();
  source_.close();
  return out;
}

at::Tensor slice_in_memory(const at::Tensor& full, const std::string& name, const ShardRequest& r) {
  if (r.whole()) return full;
  const SplitSpans split = split_spans(name, full.sizes().vec(), r);
  std::vector<at::Tensor> parts;
  for (const auto& [start, count] : split.spans) parts.push_back(full.narrow(split.dim, start, count));
  return parts.size() == 1 ? parts[0] : at::cat(parts, split.dim);
}

}  // namespace tprun::checkpoint
