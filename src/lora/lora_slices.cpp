#include "lora/lora_slices.h"

#include <limits>
#include <map>
#include <memory>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/scalar_tensor.h>
#include <fmt/format.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/slice_plan.h"
#include "checkpoint/torch_dtype.h"
#include "dist/communicator.h"
#include "parallel/lora_slot.h"
#include "runtime/error.h"

namespace tprun::lora {

using checkpoint::ShardRequest;
using checkpoint::ShardStyle;

namespace {

// The request of the tensor a layer's style splits (A for the row-wise
// family, B for the colwise family): the weight's own, applied to the
// adapter tensor's shape; the other tensor is read whole.
struct PartRequests {
  ShardRequest down, up;
};

PartRequests part_requests(const models::ModelTable& table, const std::string& module, int tp_rank, int tp_size) {
  const ShardRequest weight = table.request(module + ".weight", tp_rank, tp_size);
  PartRequests r;
  r.down.tp_rank = r.up.tp_rank = tp_rank;
  r.down.tp_size = r.up.tp_size = tp_size;
  if (checkpoint::output_is_partial(weight.style)) {
    r.down = weight;
  } else if (weight.style != ShardStyle::Replicated) {
    r.up = weight;
  }
  return r;
}

const models::TensorSpec& weight_spec(const models::ModelTable& table, const std::string& module,
                                      const std::string& file) {
  const models::TensorSpec* spec = table.find(module + ".weight");
  if (!spec) {
    throw Error(Error::Kind::Internal, fmt::format("{}: module '{}' is not a Linear of {}", file, module, table.cls));
  }
  return *spec;
}

// Reads `request`'s slice of rows [row_offset, row_offset + rows) of the
// stored 2-D tensor `key` into a host tensor in the stored dtype.
at::Tensor read_rows(checkpoint::SafetensorsSource& source, const std::string& key, int64_t row_offset, int64_t rows,
                     const ShardRequest& request) {
  const checkpoint::StoredTensor info = source.describe(key);
  const auto type = checkpoint::to_torch(info.dtype);
  if (!type || info.shape.size() != 2) {
    throw CheckpointError(fmt::format("{}: tensor '{}' is not a 2-D float tensor", source.path(), key), true);
  }
  const int bits = checkpoint::dtype_bits(info.dtype);
  const std::vector<int64_t> sub{rows, info.shape[1]};
  checkpoint::SlicePlan plan = checkpoint::plan_slice(key, sub, bits, request);
  const uint64_t shift = static_cast<uint64_t>(row_offset) * static_cast<uint64_t>(info.shape[1]) * (bits / 8);
  for (auto& range : plan.ranges) range.src += shift;
  at::Tensor host = at::empty(plan.shape, at::TensorOptions().dtype(*type));
  if (plan.bytes > 0) source.read_slice(key, request, plan, host.data_ptr());
  return host;
}

// The first non-finite tensor of the TP group: each rank's first bad index
// (2 * part + 0 for down, 1 for up), agreed as the smallest over the group.
int64_t agree_first_bad(const parallel::TpContext& tp, int64_t local_bad, int64_t none) {
  if (tp.size == 1 || !tp.comm) return local_bad;
  // Max of (none - index): the smallest index wins; exact in a double.
  at::Tensor t = at::scalar_tensor(static_cast<double>(none - local_bad), at::TensorOptions().dtype(at::kDouble));
  tp.comm->all_reduce(t, {dist::ReduceOp::Max});
  return none - static_cast<int64_t>(t.item<double>());
}

}  // namespace

LoraFileSlices read_lora_slices(const LoraLayout& layout, const std::vector<LoraModel>& models) {
  auto ckpt = std::make_shared<const checkpoint::ComponentCheckpoint>(checkpoint::ComponentCheckpoint::open(layout.path));
  checkpoint::SafetensorsSource source(ckpt);
  LoraFileSlices out;
  out.path = layout.path;
  // Every part in order, for the agreed index of a non-finite tensor.
  std::vector<const LoraModulePart*> all_parts;
  int64_t local_bad = -1;
  const parallel::TpContext* tp = nullptr;
  for (const auto& comp : layout.components) {
    const LoraModel* target = nullptr;
    for (const auto& m : models)
      if (m.component == comp.component) target = &m;
    if (!target || !target->model || !target->model->lora_targets()) {
      throw Error(Error::Kind::Internal,
                  fmt::format("{}: adapter for component '{}', which is not loaded here", layout.path, comp.component));
    }
    const models::Model& model = *target->model;
    const models::LoraTargets& targets = *model.lora_targets();
    tp = &targets.tp;
    LoraComponentSlices slices;
    slices.component = comp.component;
    for (const auto& part : comp.parts) {
      const models::TensorSpec& spec = weight_spec(model.table(), part.module, layout.path);
      const auto it = targets.modules.find(part.module);
      if (it == targets.modules.end()) {
        throw Error(Error::Kind::Internal,
                    fmt::format("{}: module '{}' of {} is not loaded on this rank", layout.path, part.module,
                                comp.component));
      }
      const PartRequests req = part_requests(model.table(), part.module, targets.tp.rank, targets.tp.size);
      const int64_t in_features = spec.shape[1];
      at::Tensor down = read_rows(source, part.down_key, 0, part.rank, req.down);
      at::Tensor up = read_rows(source, part.up_key, part.up_row_offset, part.up_rows, req.up);
      if (part.up_halves_swapped) {
        // BFL's (shift, scale) rows as diffusers' (scale, shift): read whole (the layers that take such
        // an adapter, the output modulation, are never split by rows).
        if (!req.up.whole() || part.up_rows % 2 != 0) {
          throw Error(Error::Kind::Internal,
                      fmt::format("{}: '{}' swaps the halves of a split or odd B", layout.path, part.up_key));
        }
        const int64_t half = part.up_rows / 2;
        up = at::cat({up.narrow(0, half, half), up.narrow(0, 0, half)}, 0);
      }
      if (down.size(0) != part.rank || (req.down.whole() && down.size(1) != in_features)) {
        throw Error(Error::Kind::Internal, fmt::format("{}: '{}' read as [{}, {}]", layout.path, part.down_key,
                                                       down.size(0), down.size(1)));
      }
      const int64_t index = static_cast<int64_t>(all_parts.size());
      all_parts.push_back(&part);
      if (local_bad < 0) {
        if (!at::isfinite(down.to(at::kFloat)).all().item<bool>()) {
          local_bad = 2 * index;
        } else if (!at::isfinite(up.to(at::kFloat)).all().item<bool>()) {
          local_bad = 2 * index + 1;
        }
      }
      // The layer's dtype (a layer kept in fp32 keeps its adapter in fp32 too) on its device.
      const auto dtype = checkpoint::parse_compute_dtype(spec.dtype.empty() ? targets.dtype : spec.dtype, "dtype");
      const auto options = at::TensorOptions().dtype(dtype).device(at::Device(targets.device));
      LoraModuleSlice s;
      s.module = part.module;
      s.down = down.to(options);
      s.up = up.to(options);
      s.alpha_scale = part.alpha_scale;
      out.bytes_resident += static_cast<uint64_t>(s.down.nbytes() + s.up.nbytes());
      slices.modules.push_back(std::move(s));
    }
    out.components.push_back(std::move(slices));
  }
  out.bytes_read = source.bytes_read();
  source.close();
  const int64_t none = 2 * static_cast<int64_t>(all_parts.size()) + 2;
  const int64_t bad = tp ? agree_first_bad(*tp, local_bad < 0 ? none : local_bad, none) : local_bad;
  if (bad >= 0 && bad < none) {
    const LoraModulePart& part = *all_parts[static_cast<size_t>(bad / 2)];
    throw CheckpointError(fmt::format("{}: tensor '{}' (the adapter of '{}') holds NaN or infinite values; refusing "
                                      "the adapter before any compute",
                                      layout.path, bad % 2 == 0 ? part.down_key : part.up_key, part.module),
                          true);
  }
  return out;
}

uint64_t lora_part_bytes(const LoraModulePart& part, const models::ModelTable& table, int tp_size,
                         int element_bytes) {
  const PartRequests req = part_requests(table, part.module, 0, tp_size);
  const models::TensorSpec* spec = table.find(part.module + ".weight");
  if (!spec) return 0;
  const auto rank = static_cast<uint64_t>(part.rank);
  uint64_t in = static_cast<uint64_t>(spec->shape[1]);
  uint64_t out = static_cast<uint64_t>(part.up_rows);
  if (!req.down.whole()) in /= static_cast<uint64_t>(tp_size);
  if (!req.up.whole()) out /= static_cast<uint64_t>(tp_size);
  return rank * (in + out) * static_cast<uint64_t>(element_bytes);
}

}  // namespace tprun::lora
