#include "checkpoint/shard_loader.h"

#include <algorithm>
#include <numeric>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "runtime/error.h"

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

}  // namespace

ShardLoader::ShardLoader(WeightSource& source, LoadOptions options)
    : source_(source), options_(std::move(options)) {
  if (!options_.dtype.empty()) parse_compute_dtype(options_.dtype, "dtype");
  (void)c10::Device(options_.device);  // validates the device string
}

at::Tensor ShardLoader::finish(at::Tensor host, const std::string& name, const StoredTensor& info,
                               const std::string& dtype) {
  c10::ScalarType target = host.scalar_type();
  if (!dtype.empty()) {
    target = parse_compute_dtype(dtype, "dtype");
    if (host.scalar_type() != target && !dtype_is_computable(info.dtype)) {
      throw CheckpointError(fmt::format("{}: tensor '{}' is stored as {}, which tprun cannot compute with "
                                        "(expected a floating-point weight: F32, BF16, F16 or F8)",
                                        source_.path(), name, dtype_name(info.dtype)));
    }
  }
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
  if (!dtype.empty()) parse_compute_dtype(dtype, "dtype");
  const StoredTensor info = source_.describe(name);
  if (options_.mode == LoadMode::LoadThenShard) {
    at::Tensor full = read_whole(name);
    at::Tensor part = slice_in_memory(full, name, request);
    // A view would keep the whole tensor alive: copy the slice out.
    if (part.data_ptr() != full.data_ptr() || part.numel() != full.numel())
      part = part.clone(at::MemoryFormat::Contiguous);
    return finish(part, name, info, dtype);
  }
  const SlicePlan plan = plan_slice(name, info.shape, dtype_bits(info.dtype), request);
  const c10::Device device(options_.device);
  auto opts = at::TensorOptions().dtype(stored_type(info, source_.path()));
  if (device.is_cuda()) opts = opts.pinned_memory(true);
  at::Tensor host = at::empty(plan.shape, opts);
  source_.read_slice(name, request, plan, host.data_ptr());
  return finish(host, name, info, dtype);
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
