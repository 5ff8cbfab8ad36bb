#include "models/model_builder.h"

#include <filesystem>
#include <map>
#include <set>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "memory/group_offloader.h"
#include "memory/offload_plan.h"
#include "models/model_config.h"
#include "parallel/lora_slot.h"
#include "runtime/error.h"
#include "runtime/memory_release.h"
#include "runtime/user_pattern.h"

namespace tprun::models {

using checkpoint::ShardStyle;

namespace {

// More tensors than any real model has (FLUX.2-dev: ~500, a 70B LLM: ~700).
constexpr size_t kMaxTensors = 200000;
// More elements than any real tensor or model has (2^48: 512 TiB in bf16; a
// 1T-parameter model has 2^40), so that no byte count formed from a table
// can overflow.
constexpr int64_t kMaxElements = int64_t{1} << 48;

void check_shape(const std::string& cls, const std::string& name, const std::vector<int64_t>& shape) {
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxConfigDim) {
      throw CheckpointError(fmt::format("{}: tensor '{}' would have dimension {} (from config.json); refusing", cls,
                                        name, d));
    }
    if (__builtin_mul_overflow(elements, d, &elements) || elements > kMaxElements) {
      throw CheckpointError(fmt::format("{}: tensor '{}' of shape [{}] (from config.json) is too large", cls, name,
                                        fmt::join(shape, ", ")));
    }
  }
}

// User-supplied (memory.layerwise_casting.skip) and family patterns alike, in
// RE2: linear-time matching, so no pattern can hang the load.
UserPatterns compile_patterns(const std::vector<std::string>& patterns) {
  return UserPatterns(patterns, "memory.layerwise_casting.skip");
}

// diffusers' walk: the root (""), then every enclosing module, then the module.
bool skipped(const std::string& module, const UserPatterns& patterns) {
  if (patterns.empty()) return false;
  auto any = [&](const std::string& prefix) { return patterns.search(prefix); };
  if (any("")) return true;
  for (size_t dot = module.find('.'); dot != std::string::npos; dot = module.find('.', dot + 1)) {
    if (any(module.substr(0, dot))) return true;
  }
  return any(module);
}

std::string module_of(const std::string& tensor) {
  const size_t dot = tensor.rfind('.');
  return dot == std::string::npos ? std::string() : tensor.substr(0, dot);
}

bool castable_kind(TensorKind k) {
  return k == TensorKind::Linear || k == TensorKind::Conv || k == TensorKind::Embedding;
}

// A tensor of a layer layerwise casting stores: a Linear, Conv or Embedding
// weight, or the bias of one (diffusers casts the module).
bool cast_layer(const ModelTable& table, const TensorSpec& spec) {
  if (castable_kind(spec.kind)) return true;
  if (spec.kind != TensorKind::Bias) return false;
  const TensorSpec* w = table.find(module_of(spec.name) + ".weight");
  return w && castable_kind(w->kind);
}

}  // namespace

const std::vector<std::string>& default_layerwise_casting_skip_patterns() {
  static const std::vector<std::string> patterns = {"pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$"};
  return patterns;
}

BuildOptions build_options(const ModelOptions& options, const std::vector<std::string>& class_skip) {
  BuildOptions b;
  b.dtype = options.dtype;
  b.device = options.device;
  b.mode = options.mode;
  b.layerwise_storage = options.memory.layerwise_storage;
  b.memory = options.memory;
  b.component = options.component;
  if (!b.layerwise_storage.empty()) {
    b.layerwise_skip = options.memory.layerwise_skip ? *options.memory.layerwise_skip
                                                     : default_layerwise_casting_skip_patterns();
    b.layerwise_skip.insert(b.layerwise_skip.end(), class_skip.begin(), class_skip.end());
  }
  return b;
}

bool layerwise_casting_skipped(const std::string& module, const std::vector<std::string>& patterns) {
  return skipped(module, compile_patterns(patterns));
}

struct ModelBuilder::LayerwiseCasting {
  c10::ScalarType storage;
  c10::ScalarType compute;
  UserPatterns skip;
};

void ModelBuilder::enable_layerwise_casting(const BuildOptions& options) {
  if (options.layerwise_storage.empty()) {
    casting_.reset();
    return;
  }
  auto c = std::make_shared<LayerwiseCasting>();
  if (options.layerwise_storage == "float8_e4m3fn") {
    c->storage = c10::ScalarType::Float8_e4m3fn;
  } else if (options.layerwise_storage == "float8_e5m2") {
    c->storage = c10::ScalarType::Float8_e5m2;
  } else {
    throw ConfigError(fmt::format("memory.layerwise_casting.storage: '{}' is not float8_e4m3fn or float8_e5m2",
                                  options.layerwise_storage),
                      true);
  }
  c->compute = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  c->skip = compile_patterns(options.layerwise_skip);
  casting_ = std::move(c);
}

struct ModelBuilder::Placed {
  struct Entry {
    int group = -1;
    size_t index = 0;
  };
  std::map<std::string, Entry> entries;
  std::set<int> reusable;
  std::vector<int> groups;
  c10::ScalarType compute = c10::ScalarType::Undefined;
};

namespace {

// The offloaded tensors of a load in groups: the groups in first-use order,
// each group's tensors (indices into the load's names) in load order.
struct OffloadGroups {
  std::vector<std::string> order;
  std::map<std::string, std::vector<size_t>> members;
  bool disk = false;  // some group lives on disk
};

OffloadGroups group_offloaded(const memory::ComponentPlacement& placement) {
  OffloadGroups groups;
  for (size_t i = 0; i < placement.tensors.size(); ++i) {
    const auto& p = placement.tensors[i];
    if (p.tier == memory::Tier::Resident) continue;
    if (!groups.members.count(p.group)) groups.order.push_back(p.group);
    groups.members[p.group].push_back(i);
    groups.disk = groups.disk || p.tier == memory::Tier::Disk;
  }
  return groups;
}

// Where a load's disk groups live and what their bytes depend on besides the
// checkpoint's contents: the folder is keyed on the settings (runs that
// differ never share files), each file's fingerprint adds the checkpoint's
// stamp (a changed checkpoint rewrites the files in place).
struct DiskLayout {
  std::string folder, stamp, settings_hash;
  std::map<std::string, std::string> members;  // group -> its tensors, one line each
};

DiskLayout disk_layout(const std::string& cls, const parallel::TpContext& tp, const BuildOptions& options,
                       const std::vector<const TensorSpec*>& specs, const OffloadGroups& groups,
                       const memory::ComponentPlacement& placement, const checkpoint::WeightSource& source,
                       const std::string& who) {
  const memory::MemoryOptions& mem = options.memory;
  DiskLayout layout;
  std::string settings = fmt::format("tprun offload v2\n{} tp {}/{}\ndtype {} storage {}\n", cls, tp.rank, tp.size,
                                     options.dtype, options.layerwise_storage);
  for (const auto& p : options.layerwise_skip) settings += fmt::format("skip {}:{}\n", p.size(), p);
  for (const auto& g : groups.order) {
    const auto& idx = groups.members.at(g);
    if (placement.tensors[idx.front()].tier != memory::Tier::Disk) continue;
    std::string lines;
    for (size_t i : idx) {
      lines += fmt::format("{} {} {} {}\n", specs[i]->name, checkpoint::shape_string(specs[i]->shape),
                           checkpoint::shard_style_name(specs[i]->style), specs[i]->dtype);
    }
    settings += fmt::format("group {}\n{}", g, lines);
    layout.members[g] = std::move(lines);
  }
  const bool offload_disk = mem.offload.enabled() && mem.offload.to == "disk";
  const std::string root = offload_disk ? mem.offload.disk_path
                                        : (!mem.offload_folder.empty() ? mem.offload_folder : mem.offload.disk_path);
  const std::string key = offload_disk ? "memory.offload.disk_path" : "memory.offload_folder";
  if (root.empty()) {
    throw ConfigError(fmt::format("memory.device_map places weights of {} on \"disk\" but no folder is set: give "
                                  "memory.offload_folder",
                                  who),
                      true);
  }
  layout.folder = memory::disk_group_folder(root, source.path(), settings, tp.rank, tp.size);
  memory::check_writable_folder(layout.folder, key);
  layout.stamp = memory::checkpoint_stamp(source.path());
  layout.settings_hash = memory::stable_hash(settings);
  return layout;
}

}  // namespace

void ModelBuilder::place_weights(const BuildOptions& options, const checkpoint::WeightSource& source) {
  const memory::MemoryOptions& mem = options.memory;
  placed_.reset();
  if (!mem.device_map_strategy.empty()) {
    throw ConfigError("memory.device_map = \"balanced\" places the components of a pipeline (tprun generate / run); "
                      "for one component give a table of module = device",
                      true);
  }
  memory::refuse_device_map_with_tp(mem, tp_.size);
  if (!mem.offload.enabled() && mem.device_map.empty()) return;
  std::vector<std::string> names;
  std::vector<const TensorSpec*> specs;
  for (const auto& t : table_->tensors) {
    if (t.optional || !wanted(t.name)) continue;
    names.push_back(t.name);
    specs.push_back(&t);
  }
  const auto placement = memory::place_tensors(names, mem, options.device, options.component);
  const std::string who = options.component.empty() ? table_->cls : options.component;
  if (placement.offload_noop) {
    spdlog::info("{}: memory.offload to \"cpu\": this rank computes on the host, so there is nothing to move "
                 "(to = \"disk\" is what cuts host memory here)",
                 who);
  }
  const OffloadGroups groups = group_offloaded(placement);
  if (groups.order.empty()) return;
  auto placed = std::make_shared<Placed>();
  placed->compute = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  const DiskLayout disk =
      groups.disk ? disk_layout(table_->cls, tp_, options, specs, groups, placement, source, who) : DiskLayout{};
  auto& offloader = memory::GroupOffloader::instance();
  uint64_t reused_bytes = 0;
  for (const auto& g : groups.order) {
    const auto& idx = groups.members.at(g);
    memory::GroupSpec spec;
    spec.label = fmt::format("{} {}", who, g);
    spec.tier = placement.tensors[idx.front()].tier;
    spec.device = options.device;
    spec.prefetch = mem.offload.prefetch;
    for (size_t i : idx) spec.names.push_back(names[i]);
    if (spec.tier == memory::Tier::Disk) {
      spec.fingerprint = memory::stable_hash(
          fmt::format("{}\n{}\ngroup {}\n{}", disk.stamp, disk.settings_hash, g, disk.members.at(g)));
      spec.file = (std::filesystem::path(disk.folder) / memory::disk_group_file(g)).string();
    }
    const int id = offloader.add_group(std::move(spec));
    placed->groups.push_back(id);
    if (offloader.reusable(id)) {
      placed->reusable.insert(id);
      reused_bytes += offloader.group_bytes(id);
    }
    for (size_t k = 0; k < idx.size(); ++k) placed->entries[names[idx[k]]] = {id, k};
  }
  spdlog::info("{}: {} of {} tensors in {} offload groups{}{}", who, placed->entries.size(), names.size(),
               groups.order.size(), groups.disk ? fmt::format(" (disk: {})", disk.folder) : std::string(),
               placed->reusable.empty()
                   ? std::string()
                   : fmt::format("; {} groups ({} bytes) reused from disk, not read again", placed->reusable.size(),
                                 reused_bytes));
  placed_ = std::move(placed);
}

ModelBuilder::ModelBuilder(std::string cls) { record_.cls = std::move(cls); }

ModelBuilder::ModelBuilder(const ModelTable& table, checkpoint::ShardLoader& loader, const parallel::TpContext& tp,
                           LoadFilter wanted)
    : table_(&table), loader_(&loader), tp_(tp), wanted_(std::move(wanted)), lora_targets_(std::make_shared<LoraTargets>()) {
  lora_targets_->tp = tp;
  lora_targets_->device = loader.options().device;
  lora_targets_->dtype = loader.options().dtype.empty() ? "fp32" : loader.options().dtype;
}

const TensorSpec& ModelBuilder::declare(TensorSpec spec) {
  if (recording()) {
    check_shape(record_.cls, spec.name, spec.shape);
    if (record_.tensors.size() >= kMaxTensors) {
      throw CheckpointError(fmt::format("{}: the config asks for more than {} tensors; refusing", record_.cls,
                                        kMaxTensors));
    }
    record_.tensors.push_back(std::move(spec));
    return record_.tensors.back();
  }
  // Loading: the construction must ask for exactly what it recorded, in order.
  const auto& tensors = table_->tensors;
  const TensorSpec* recorded = declared_ < tensors.size() && tensors[declared_].name == spec.name
                                   ? &tensors[declared_]
                                   : table_->find(spec.name);
  if (!recorded) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: tensor '{}' is not in the model table", table_->cls, spec.name));
  }
  if (recorded->shape != spec.shape || recorded->style != spec.style || recorded->blocks != spec.blocks) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: tensor '{}' declared as {} {} but the table holds {} {}", table_->cls, spec.name,
                            checkpoint::shape_string(spec.shape), checkpoint::shard_style_name(spec.style),
                            checkpoint::shape_string(recorded->shape),
                            checkpoint::shard_style_name(recorded->style)));
  }
  ++declared_;
  return *recorded;
}

parallel::Weight ModelBuilder::load(const TensorSpec& spec) {
  if (recording() || spec.optional || !wanted(spec.name)) return {};
  const Placed::Entry* placed = nullptr;
  if (placed_) {
    auto it = placed_->entries.find(spec.name);
    if (it != placed_->entries.end()) placed = &it->second;
  }
  // An offloaded weight is handed to compute in its layer's dtype (up-cast from fp8 storage).
  const auto target = [&] {
    return spec.dtype.empty() ? placed_->compute : checkpoint::parse_compute_dtype(spec.dtype, spec.name);
  };
  if (placed && placed_->reusable.count(placed->group)) {
    // Its group's file already holds this slice: not read again.
    return parallel::Weight(spec.name, parallel::offloaded_storage(placed->group, placed->index, target()));
  }
  const auto request = table_->request(spec.name, tp_.rank, tp_.size);
  at::Tensor t;
  std::shared_ptr<parallel::WeightStorage> storage;
  // Layers that keep a dtype of their own (fp32) are never cast; the others
  // load in the compute dtype, which layerwise casting up-casts to per use.
  if (casting_ && spec.dtype.empty() && cast_layer(*table_, spec) && !skipped(module_of(spec.name), casting_->skip)) {
    // This slice alone, cast as it is read: the loader converts it in its
    // reused staging buffer, so no full-precision copy is ever allocated.
    t = loader_->load_cast(spec.name, request, casting_->storage);
    cast_compute_bytes_ += static_cast<uint64_t>(t.numel()) * c10::elementSize(casting_->compute);
    cast_storage_bytes_ += static_cast<uint64_t>(t.nbytes());
    ++cast_tensors_;
    if (!placed) storage = parallel::layerwise_cast_storage(t, casting_->compute);
  } else {
    t = spec.dtype.empty() ? loader_->load(spec.name, request) : loader_->load_as(spec.name, request, spec.dtype);
  }
  if (placed) {
    bytes_offloaded_ += static_cast<uint64_t>(t.nbytes());
    memory::GroupOffloader::instance().put(placed->group, placed->index, t);
    return parallel::Weight(spec.name, parallel::offloaded_storage(placed->group, placed->index, target()));
  }
  bytes_stored_ += static_cast<uint64_t>(t.nbytes());
  return parallel::Weight(spec.name, storage ? storage : parallel::resident_storage(t));
}

parallel::ParallelLinear ModelBuilder::linear(const std::string& name, int64_t out, int64_t in, const LinearDecl& d) {
  TensorSpec w;
  w.name = name + ".weight";
  w.shape = {out, in};
  w.kind = TensorKind::Linear;
  w.style = d.style;
  w.blocks = checkpoint::is_packed(d.style) ? d.blocks : std::vector<int64_t>{};
  w.dtype = d.dtype;
  if (d.style != ShardStyle::Replicated) w.plan_key = plan_key_of(name);
  const TensorSpec& ws = declare(w);
  parallel::Weight weight = load(ws);
  parallel::Weight bias;
  if (d.bias) {
    TensorSpec b;
    b.name = name + ".bias";
    b.shape = {out};
    b.kind = TensorKind::Bias;
    b.style = checkpoint::bias_style(d.style);
    b.blocks = checkpoint::split_dim(b.style) == 0 ? w.blocks : std::vector<int64_t>{};
    b.dtype = d.dtype;
    b.plan_key = w.plan_key;
    bias = load(declare(b));
  }
  if (recording() || !weight.defined()) return {};
  std::vector<int64_t> in_blocks;
  if (d.style == ShardStyle::PackedRowwise) {
    in_blocks = d.blocks;
  } else if (checkpoint::output_is_partial(d.style)) {
    in_blocks = {in};
  }
  parallel::ParallelLinear layer(name, d.style, std::move(in_blocks), tp_, weight, std::move(bias));
  auto slot = std::make_shared<parallel::LoraSlot>();
  layer.attach_lora_slot(slot);
  lora_targets_->modules[name] = LoraTarget{std::move(slot), std::move(weight)};
  return layer;
}

parallel::Weight ModelBuilder::tensor(const std::string& name, std::vector<int64_t> shape, TensorKind kind) {
  return tensor(name, std::move(shape), kind, ShardStyle::Replicated);
}

parallel::Weight ModelBuilder::tensor(const std::string& name, std::vector<int64_t> shape, TensorKind kind,
                                      ShardStyle style, const std::string& dtype) {
  TensorSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.kind = kind;
  s.style = style;
  s.dtype = dtype;
  if (style != ShardStyle::Replicated) s.plan_key = plan_key_of(module_of(name));
  return load(declare(std::move(s)));
}

void ModelBuilder::unused(const std::string& name, std::vector<int64_t> shape, TensorKind kind, bool saved) {
  TensorSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.kind = kind;
  s.optional = true;
  s.saved = saved;
  declare(std::move(s));
}

Affine ModelBuilder::conv2d(const std::string& name, int64_t out, int64_t in, int64_t kernel) {
  Affine a;
  a.weight = tensor(name + ".weight", {out, in, kernel, kernel}, TensorKind::Conv);
  a.bias = tensor(name + ".bias", {out}, TensorKind::Bias);
  return a;
}

Affine ModelBuilder::norm(const std::string& name, int64_t channels) {
  Affine a;
  a.weight = tensor(name + ".weight", {channels}, TensorKind::Norm);
  a.bias = tensor(name + ".bias", {channels}, TensorKind::Bias);
  return a;
}

void ModelBuilder::tp_divides(const std::string& field, int64_t value) {
  if (recording()) record_.tp_divisors.push_back({field, value});
}

void ModelBuilder::finish() const {
  if (recording()) return;
  if (placed_) memory::GroupOffloader::instance().check_complete(placed_->groups);
  if (declared_ != table_->tensors.size()) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: the construction declared {} of the table's {} tensors", table_->cls, declared_,
                            table_->tensors.size()));
  }
}

ModelTable record_table(const std::string& cls, const std::function<void(ModelBuilder&)>& declare) {
  ModelBuilder b(cls);
  declare(b);
  ModelTable table = b.take_table();
  int64_t total = 0;  // each tensor is at most kMaxElements, so the sum cannot overflow before the check
  for (const auto& t : table.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    total += n;
    if (total > kMaxElements) {
      throw CheckpointError(fmt::format("{}: the config asks for more than {} elements in all (at '{}'); refusing",
                                        cls, kMaxElements, t.name));
    }
  }
  return table;
}

BuiltModel build_model(const std::string& cls, checkpoint::WeightSource& source, const parallel::TpContext& tp,
                       const BuildOptions& options, const std::function<void(ModelBuilder&)>& declare) {
  BuiltModel built;
  built.table = record_table(cls, declare);
  // Before any weight byte: the wanted part of the table against the headers.
  ModelTable wanted = built.table;
  if (options.wanted) {
    wanted.tensors.clear();
    for (const auto& t : built.table.tensors)
      if (options.wanted(t.name)) wanted.tensors.push_back(t);
  }
  validate_tp_plan(wanted, source, tp.size);
  parallel::check_tp_context(tp);

  checkpoint::LoadOptions lopts{options.mode, options.device, options.dtype};
  checkpoint::ShardLoader loader(source, lopts);
  const uint64_t before = loader.bytes_read();
  ModelBuilder b(built.table, loader, tp, options.wanted);
  b.enable_layerwise_casting(options);
  const auto offload_before = memory::GroupOffloader::instance().stats();
  b.place_weights(options, source);
  declare(b);
  b.finish();
  source.close();
  const auto offload_after = memory::GroupOffloader::instance().stats();
  const int64_t written = offload_after.files_written - offload_before.files_written;
  const int64_t reused = offload_after.files_reused - offload_before.files_reused;
  const int64_t shared = offload_after.files_shared - offload_before.files_shared;
  if (written + reused + shared > 0) {
    spdlog::info("{}: disk offload: {} group files written ({} of them rewritten), {} reused, {} written meanwhile by "
                 "another run sharing the folder",
                 cls, written, offload_after.files_rewritten - offload_before.files_rewritten, reused, shared);
  }
  built.bytes_read = loader.bytes_read() - before;
  built.bytes_stored = b.bytes_stored();
  built.lora_targets = b.lora_targets();
  // What the load allocated and freed (a slice's copy in another dtype than
  // the one it is kept in, caches of the copies to the device) goes back to
  // the system now: the heap's free pages would otherwise stay in this
  // process's RSS for the rest of the run.
  const uint64_t released = release_free_memory();
  if (released > 0) spdlog::debug("{}: {} bytes of freed load buffers returned to the system", cls, released);
  if (!options.layerwise_storage.empty()) {
    spdlog::info("{}: {} tensors (Linear / Conv / Embedding weights and biases) stored in {}: {} -> {} bytes; "
                 "resident weights {} bytes this rank",
                 cls, b.cast_tensors(), options.layerwise_storage, b.cast_bytes_in_compute_dtype(),
                 b.cast_bytes_in_storage_dtype(), built.bytes_stored);
  }
  if (b.bytes_offloaded() > 0) {
    spdlog::info("{}: {} bytes offloaded off the compute device, {} bytes resident this rank", cls,
                 b.bytes_offloaded(), built.bytes_stored);
  }
  return built;
}

}  // namespace tprun::models
