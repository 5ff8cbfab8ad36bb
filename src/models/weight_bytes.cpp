#include "models/weight_bytes.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/slice_plan.h"
#include "memory/offload_plan.h"
#include "runtime/error.h"
#include "runtime/user_pattern.h"

namespace tprun::models {
namespace {

namespace fs = std::filesystem;

// ShardRequest of a table entry (ModelTable::request without its name lookup).
checkpoint::ShardRequest request_of(const TensorSpec& spec, int rank, int tp) {
  checkpoint::ShardRequest r;
  r.tp_rank = rank;
  r.tp_size = tp;
  r.style = spec.style;
  r.blocks = spec.blocks;
  r.blocks_absolute = !spec.blocks.empty();
  return r;
}

uint64_t compute_dtype_bytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  throw ConfigError(fmt::format("dtype '{}' is not fp32, bf16 or fp16", dtype), true);
}

bool castable_kind(TensorKind k) {
  return k == TensorKind::Linear || k == TensorKind::Conv || k == TensorKind::Embedding;
}

std::string module_of(const std::string& tensor) {
  const size_t dot = tensor.rfind('.');
  return dot == std::string::npos ? std::string() : tensor.substr(0, dot);
}

// diffusers' walk, as ModelBuilder applies it: the root (""), every enclosing module, the module.
bool skipped(const std::string& module, const UserPatterns& patterns) {
  if (patterns.empty()) return false;
  if (patterns.search("")) return true;
  for (size_t dot = module.find('.'); dot != std::string::npos; dot = module.find('.', dot + 1)) {
    if (patterns.search(module.substr(0, dot))) return true;
  }
  return patterns.search(module);
}

// Whether layerwise casting stores `spec` narrower: a Linear / Conv /
// Embedding parameter (a bias with its layer) in the compute dtype whose
// module no pattern skips (ModelBuilder::load).
bool layerwise_cast(const TensorSpec& spec, const std::unordered_map<std::string, const TensorSpec*>& by_name,
                    const UserPatterns& skip) {
  if (!spec.dtype.empty()) return false;
  const std::string module = module_of(spec.name);
  bool layer = castable_kind(spec.kind);
  if (!layer && spec.kind == TensorKind::Bias) {
    auto it = by_name.find(module + ".weight");
    layer = it != by_name.end() && castable_kind(it->second->kind);
  }
  return layer && !skipped(module, skip);
}

// Where a load with `build` places `names` (ModelBuilder::place_weights): none
// off the device without offload or a device map.
memory::ComponentPlacement placement_of(const std::vector<std::string>& names, const BuildOptions& build, int tp) {
  const memory::MemoryOptions& mem = build.memory;
  if (!mem.device_map_strategy.empty()) {
    throw ConfigError("memory.device_map = \"balanced\" places the components of a pipeline (tprun generate / run); "
                      "for one component give a table of module = device",
                      true);
  }
  memory::refuse_device_map_with_tp(mem, tp);
  if (!mem.offload.enabled() && mem.device_map.empty()) {
    memory::ComponentPlacement none;
    none.tensors.resize(names.size());
    return none;
  }
  return memory::place_tensors(names, mem, build.device, build.component);
}

}  // namespace

std::vector<std::string> ComponentListing::names() const {
  std::vector<std::string> out;
  out.reserve(rows.size());
  for (const auto& r : rows) out.push_back(r.name);
  return out;
}

ComponentListing list_component(const std::string& path, const std::string& variant) {
  ComponentListing l;
  if (checkpoint::is_hdf5_file(path)) {
    checkpoint::Hdf5Source src(path);
    l.config = src.config();
    l.has_config = src.has_config();
    l.config_path = path + ":config.json";
    l.files.push_back(fs::path(path).filename().string());
    for (const auto& n : src.tensor_names()) {
      const auto t = src.describe(n);
      l.rows.push_back({n, t.dtype, t.shape, t.nbytes(), l.files[0]});
    }
  } else {
    const auto ck = checkpoint::ComponentCheckpoint::open(path, variant);
    l.config = ck.config();
    l.has_config = ck.has_config();
    l.config_path = (fs::path(path) / "config.json").string();
    l.index = ck.index_path();
    for (const auto& f : ck.files()) l.files.push_back(fs::path(f.file).filename().string());
    for (const auto& n : ck.tensor_names()) {
      const auto loc = ck.locate(n);
      l.rows.push_back({n, loc.entry->dtype, loc.entry->shape, loc.entry->nbytes(),
                        fs::path(ck.files()[loc.file].file).filename().string()});
    }
  }
  for (const auto& r : l.rows) l.total += r.bytes;
  return l;
}

std::vector<uint64_t> bytes_per_rank(const std::vector<StoredRow>& rows, const ModelTable* table, int tp,
                                     const RowFilter& counted) {
  std::unordered_map<std::string, const TensorSpec*> by_name;
  if (table) {
    for (const auto& t : table->tensors) by_name.emplace(t.name, &t);
  }
  std::vector<uint64_t> per_rank(static_cast<size_t>(tp), 0);
  for (const auto& row : rows) {
    if (counted && !counted(row)) continue;
    const auto it = by_name.find(row.name);
    for (int r = 0; r < tp; ++r) {
      // Tensors the model does not know are read whole.
      checkpoint::ShardRequest req = it != by_name.end() ? request_of(*it->second, r, tp) : checkpoint::ShardRequest{};
      req.tp_rank = r;
      req.tp_size = tp;
      per_rank[static_cast<size_t>(r)] +=
          checkpoint::plan_slice(row.name, row.shape, checkpoint::dtype_bits(row.dtype), req).bytes;
    }
  }
  return per_rank;
}

RankWeights rank_weights(const std::vector<StoredRow>& rows, const ModelTable& table, int rank, int tp,
                         const BuildOptions& build, const std::string& source) {
  std::unordered_map<std::string, const StoredRow*> stored;
  for (const auto& r : rows) stored.emplace(r.name, &r);
  std::unordered_map<std::string, const TensorSpec*> by_name;
  for (const auto& t : table.tensors) by_name.emplace(t.name, &t);
  const UserPatterns skip(build.layerwise_skip, "memory.layerwise_casting.skip");
  const bool casting = !build.layerwise_storage.empty();
  if (casting && build.layerwise_storage != "float8_e4m3fn" && build.layerwise_storage != "float8_e5m2") {
    throw ConfigError(fmt::format("memory.layerwise_casting.storage: '{}' is not float8_e4m3fn or float8_e5m2",
                                  build.layerwise_storage),
                      true);
  }
  const uint64_t compute = compute_dtype_bytes(build.dtype);

  // The tensors the load reads, in load order, with the bytes each keeps.
  std::vector<std::string> names;
  std::vector<uint64_t> kept;
  RankWeights w;
  for (const auto& spec : table.tensors) {
    if (spec.optional || (build.wanted && !build.wanted(spec.name))) continue;
    const auto it = stored.find(spec.name);
    if (it == stored.end()) {
      throw CheckpointError(fmt::format("{}: tensor '{}' (shape {}) that {} needs is missing", source, spec.name,
                                        checkpoint::shape_string(spec.shape), table.cls),
                            true);
    }
    const StoredRow& row = *it->second;
    const int bits = checkpoint::dtype_bits(row.dtype);
    const uint64_t bytes = checkpoint::plan_slice(row.name, row.shape, bits, request_of(spec, rank, tp)).bytes;
    w.read += bytes;
    const uint64_t elements = bytes * 8 / static_cast<uint64_t>(bits);
    const uint64_t elem = casting && layerwise_cast(spec, by_name, skip)
                              ? 1
                              : (spec.dtype.empty() ? compute : compute_dtype_bytes(spec.dtype));
    names.push_back(spec.name);
    kept.push_back(elements * elem);
  }

  const memory::ComponentPlacement placement = placement_of(names, build, tp);
  std::map<std::string, uint64_t> groups;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& p = placement.tensors[i];
    if (p.tier == memory::Tier::Resident) {
      w.resident += kept[i];
      continue;
    }
    w.offloaded += kept[i];
    if (p.tier == memory::Tier::Host) w.host += kept[i];
    groups[p.group] += kept[i];
  }
  for (const auto& [name, bytes] : groups) w.largest_group = std::max(w.largest_group, bytes);
  return w;
}

}  // namespace tprun::models
