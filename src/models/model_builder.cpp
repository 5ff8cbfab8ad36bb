#include "models/model_builder.h"

#include <regex>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/torch_dtype.h"
#include "checkpoint/weight_source.h"
#include "models/model_config.h"
#include "runtime/error.h"

namespace tprun::models {

using checkpoint::ShardStyle;

namespace {

// More tensors than any real model has (FLUX.2-dev: ~500, a 70B LLM: ~700).
constexpr size_t kMaxTensors = 200000;

void check_shape(const std::string& cls, const std::string& name, const std::vector<int64_t>& shape) {
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxConfigDim) {
      throw CheckpointError(fmt::format("{}: tensor '{}' would have dimension {} (from config.json); refusing", cls,
                                        name, d));
    }
    if (__builtin_mul_overflow(elements, d, &elements) || elements > (INT64_MAX >> 3)) {
      throw CheckpointError(fmt::format("{}: tensor '{}' of shape [{}] (from config.json) is too large", cls, name,
                                        fmt::join(shape, ", ")));
    }
  }
}

std::vector<std::regex> compile_patterns(const std::vector<std::string>& patterns) {
  std::vector<std::regex> out;
  out.reserve(patterns.size());
  for (const auto& p : patterns) {
    try {
      out.emplace_back(p, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError(fmt::format("memory.layerwise_casting.skip: '{}' is not a regular expression ({})", p,
                                    e.what()),
                        true);
    }
  }
  return out;
}

// diffusers' walk: the root (""), then every enclosing module, then the module.
bool skipped(const std::string& module, const std::vector<std::regex>& patterns) {
  if (patterns.empty()) return false;
  auto any = [&](const std::string& prefix) {
    for (const auto& re : patterns)
      if (std::regex_search(prefix, re)) return true;
    return false;
  };
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

}  // namespace

const std::vector<std::string>& default_storage_skip_patterns() {
  static const std::vector<std::string> patterns = {"pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$"};
  return patterns;
}

BuildOptions build_options(const ModelOptions& options, const std::vector<std::string>& class_skip) {
  BuildOptions b;
  b.dtype = options.dtype;
  b.device = options.device;
  b.mode = options.mode;
  b.storage = options.memory.layerwise_storage;
  if (!b.storage.empty()) {
    b.storage_skip = options.memory.layerwise_skip ? *options.memory.layerwise_skip : default_storage_skip_patterns();
    b.storage_skip.insert(b.storage_skip.end(), class_skip.begin(), class_skip.end());
  }
  return b;
}

bool narrow_storage_skipped(const std::string& module, const std::vector<std::string>& patterns) {
  return skipped(module, compile_patterns(patterns));
}

struct ModelBuilder::Narrow {
  c10::ScalarType storage;
  c10::ScalarType compute;
  std::vector<std::regex> skip;
};

void ModelBuilder::narrow_storage(const BuildOptions& options) {
  if (options.storage.empty()) {
    narrow_.reset();
    return;
  }
  auto n = std::make_shared<Narrow>();
  if (options.storage == "float8_e4m3fn") {
    n->storage = c10::ScalarType::Float8_e4m3fn;
  } else if (options.storage == "float8_e5m2") {
    n->storage = c10::ScalarType::Float8_e5m2;
  } else {
    throw ConfigError(fmt::format("memory.layerwise_casting.storage: '{}' is not float8_e4m3fn or float8_e5m2",
                                  options.storage),
                      true);
  }
  n->compute = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  n->skip = compile_patterns(options.storage_skip);
  narrow_ = std::move(n);
}

ModelBuilder::ModelBuilder(std::string cls) { record_.cls = std::move(cls); }

ModelBuilder::ModelBuilder(const ModelTable& table, checkpoint::ShardLoader& loader, const parallel::TpContext& tp,
                           LoadFilter wanted)
    : table_(&table), loader_(&loader), tp_(tp), wanted_(std::move(wanted)) {}

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
  const auto request = table_->request(spec.name, tp_.rank, tp_.size);
  at::Tensor t = spec.dtype.empty() ? loader_->load(spec.name, request)
                                    : loader_->load_as(spec.name, request, spec.dtype);
  if (narrow_ && spec.dtype.empty() && t.scalar_type() == narrow_->compute) {
    const std::string module = module_of(spec.name);
    bool layer = castable_kind(spec.kind);
    if (!layer && spec.kind == TensorKind::Bias) {  // the bias of a Linear / Conv (diffusers casts the module)
      const TensorSpec* w = table_->find(module + ".weight");
      layer = w && castable_kind(w->kind);
    }
    if (layer && !skipped(module, narrow_->skip)) {
      // This slice alone, as it arrives: the full-precision copy is dropped here.
      at::Tensor stored = t.to(narrow_->storage);
      narrowed_from_ += static_cast<uint64_t>(t.nbytes());
      t = at::Tensor();
      bytes_stored_ += static_cast<uint64_t>(stored.nbytes());
      narrowed_to_ += static_cast<uint64_t>(stored.nbytes());
      ++narrowed_;
      return parallel::Weight(spec.name, parallel::cast_storage(stored, narrow_->compute));
    }
  }
  bytes_stored_ += static_cast<uint64_t>(t.nbytes());
  return parallel::Weight(spec.name, parallel::resident_storage(t));
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
  return parallel::ParallelLinear(name, d.style, std::move(in_blocks), tp_, std::move(weight), std::move(bias));
}

parallel::Weight ModelBuilder::tensor(const std::string& name, std::vector<int64_t> shape, TensorKind kind) {
  TensorSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.kind = kind;
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
  if (declared_ != table_->tensors.size()) {
    throw Error(Error::Kind::Internal,
                fmt::format("{}: the construction declared {} of the table's {} tensors", table_->cls, declared_,
                            table_->tensors.size()));
  }
}

ModelTable record_table(const std::string& cls, const std::function<void(ModelBuilder&)>& declare) {
  ModelBuilder b(cls);
  declare(b);
  return b.take_table();
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
  b.narrow_storage(options);
  declare(b);
  b.finish();
  source.close();
  built.bytes_read = loader.bytes_read() - before;
  built.bytes_stored = b.bytes_stored();
  if (!options.storage.empty()) {
    spdlog::info("{}: {} tensors (Linear / Conv / Embedding weights and biases) stored in {}: {} -> {} bytes; "
                 "resident weights {} bytes this rank",
                 cls, b.narrowed(), options.storage, b.narrowed_from_bytes(),
                 b.narrowed_to_bytes(), built.bytes_stored);
  }
  return built;
}

}  // namespace tprun::models
