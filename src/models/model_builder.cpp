#include "models/model_builder.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/safetensors_header.h"
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

}  // namespace

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
  declare(b);
  b.finish();
  source.close();
  built.bytes_read = loader.bytes_read() - before;
  return built;
}

}  // namespace tprun::models
