#pragma once
// Where a model's construction declares its tensors, once each (llama.cpp's
// create_tensor): a name exactly as diffusers / transformers save it, a shape
// computed from the config, a kind and a tensor-parallel style. The same
// construction code runs twice:
//   recording  each declaration appends a TensorSpec to a ModelTable and
//              returns an undefined layer; no checkpoint is touched. The table
//              is what inspect, validation, init-model and the tests read.
//   loading    given the recorded (and validated) table, each declaration
//              reads this rank's slice through the ShardLoader and returns the
//              loaded layer. A name the table does not hold, or a shape or
//              style other than the recorded one, is an internal error: a
//              tensor is never silently replicated.
// build_model() runs both phases around the validation, so every model loads
// the same way: record, validate before the first byte, load.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/shard_loader.h"
#include "memory/memory_options.h"
#include "models/lora_targets.h"
#include "models/model.h"
#include "models/model_table.h"
#include "parallel/parallel_linear.h"
#include "parallel/tp_context.h"
#include "parallel/weight.h"

namespace tprun::models {

// How a Linear is declared: its style, whether it has a bias, packed block
// sizes, and a dtype it keeps. Built with the named constructors:
//   LinearDecl::colwise().with_bias(), LinearDecl::packed_rowwise({inner, mlp}),
//   LinearDecl::rowwise().in_fp32() ...
struct LinearDecl {
  checkpoint::ShardStyle style = checkpoint::ShardStyle::Replicated;
  bool bias = false;
  // Packed styles: the absolute block sizes along the split dim (they sum to
  // `out` for packed colwise, to `in` for packed rowwise).
  std::vector<int64_t> blocks;
  std::string dtype;  // "" = compute dtype; "fp32" keeps this layer in fp32

  static LinearDecl replicated() { return of(checkpoint::ShardStyle::Replicated); }
  static LinearDecl colwise() { return of(checkpoint::ShardStyle::Colwise); }
  static LinearDecl rowwise() { return of(checkpoint::ShardStyle::Rowwise); }
  static LinearDecl rowwise_split_input() { return of(checkpoint::ShardStyle::RowwiseSplitInput); }
  static LinearDecl packed_colwise(std::vector<int64_t> blocks) {
    return of(checkpoint::ShardStyle::PackedColwise, std::move(blocks));
  }
  static LinearDecl packed_rowwise(std::vector<int64_t> blocks) {
    return of(checkpoint::ShardStyle::PackedRowwise, std::move(blocks));
  }
  static LinearDecl of(checkpoint::ShardStyle style, std::vector<int64_t> blocks = {}) {
    LinearDecl d;
    d.style = style;
    d.blocks = std::move(blocks);
    return d;
  }
  LinearDecl with_bias(bool yes = true) const {
    LinearDecl d = *this;
    d.bias = yes;
    return d;
  }
  LinearDecl in_dtype(std::string keep) const {
    LinearDecl d = *this;
    d.dtype = std::move(keep);
    return d;
  }
};

// Conv2d / GroupNorm / LayerNorm parameters (weight and bias), replicated.
struct Affine {
  parallel::Weight weight, bias;
};

// Which declared tensors a load reads (the others come back undefined and
// are not validated): e.g. only the VAE's decoder, or the text-encoder
// layers a pipeline uses. Empty: all of them.
using LoadFilter = std::function<bool(const std::string& name)>;

struct BuildOptions;

class ModelBuilder {
 public:
  // Recording: the table of `cls`.
  explicit ModelBuilder(std::string cls);
  // Loading `table` (recorded by the same construction) for `tp`.
  ModelBuilder(const ModelTable& table, checkpoint::ShardLoader& loader, const parallel::TpContext& tp,
               LoadFilter wanted = {});

  bool recording() const { return loader_ == nullptr; }
  // Loading: layerwise casting (diffusers' enable_layerwise_casting): keep
  // the parameters of Linear, Conv and Embedding layers (weight and bias) in
  // the storage dtype `options.layerwise_storage`, up-cast per use, unless
  // their module is skipped (layerwise_casting_skipped) or declared to keep a
  // dtype. Patterns compiled here (ConfigError for one that is not a regex).
  void enable_layerwise_casting(const BuildOptions& options);
  // Loading: place the wanted tensors of the table under options.memory's
  // offload and device map (memory/offload_plan.h) before any is read: the
  // offloaded ones are kept in groups by memory::GroupOffloader, a disk group
  // whose file already holds them is not read again. ConfigError naming the
  // key for a device map entry that names no module, or a disk folder that
  // cannot be written.
  void place_weights(const BuildOptions& options, const checkpoint::WeightSource& source);
  // Loading: resident bytes of the weights loaded so far; of them, the
  // tensors kept in the storage dtype by layerwise casting, the bytes they
  // would take in the compute dtype and the bytes they take stored.
  uint64_t bytes_stored() const { return bytes_stored_; }
  int64_t cast_tensors() const { return cast_tensors_; }
  uint64_t cast_bytes_in_compute_dtype() const { return cast_compute_bytes_; }
  uint64_t cast_bytes_in_storage_dtype() const { return cast_storage_bytes_; }
  uint64_t bytes_offloaded() const { return bytes_offloaded_; }
  // Loading: every Linear loaded so far, for adapters (models/lora_targets.h).
  const std::shared_ptr<LoraTargets>& lora_targets() const { return lora_targets_; }

  // A Linear `name` (a module; ".weight" [out, in] and, with d.bias,
  // ".bias" [out] are declared).
  parallel::ParallelLinear linear(const std::string& name, int64_t out, int64_t in, const LinearDecl& d = {});
  // One replicated tensor.
  parallel::Weight tensor(const std::string& name, std::vector<int64_t> shape, TensorKind kind);
  // One tensor split by `style` (colwise: along dim 0, e.g. a norm weight over
  // the features of a colwise layer's output; its plan key is its module's)
  // and kept in `dtype` ("" = the compute dtype, "fp32": diffusers'
  // _keep_in_fp32_modules).
  parallel::Weight tensor(const std::string& name, std::vector<int64_t> shape, TensorKind kind,
                          checkpoint::ShardStyle style, const std::string& dtype = "");
  // A tensor the checkpoint may hold that the model never reads (a buffer, a
  // tied copy, a part of the model tprun never runs): in the table as
  // optional, never loaded. `saved`: whether save_pretrained writes it (so
  // init-model does); false for tied copies and non-persistent buffers.
  void unused(const std::string& name, std::vector<int64_t> shape, TensorKind kind, bool saved = true);
  // Conv2d `name`: ".weight" [out, in, k, k], ".bias" [out].
  Affine conv2d(const std::string& name, int64_t out, int64_t in, int64_t kernel);
  // GroupNorm / LayerNorm with affine parameters: ".weight", ".bias" [channels].
  Affine norm(const std::string& name, int64_t channels);
  // A size tp must divide (checked before any byte: "num_attention_heads").
  void tp_divides(const std::string& field, int64_t value);

  // Recording: the table so far. Loading: the table being loaded.
  const ModelTable& table() const { return recording() ? record_ : *table_; }
  ModelTable take_table() { return std::move(record_); }
  // Loading: Internal error unless every wanted tensor of the table was declared.
  void finish() const;

 private:
  const TensorSpec& declare(TensorSpec spec);
  parallel::Weight load(const TensorSpec& spec);
  bool wanted(const std::string& name) const { return !wanted_ || wanted_(name); }

  ModelTable record_;
  const ModelTable* table_ = nullptr;
  checkpoint::ShardLoader* loader_ = nullptr;
  parallel::TpContext tp_;
  LoadFilter wanted_;
  size_t declared_ = 0;
  struct LayerwiseCasting;
  std::shared_ptr<const LayerwiseCasting> casting_;
  struct Placed;
  std::shared_ptr<Placed> placed_;
  uint64_t bytes_offloaded_ = 0;
  uint64_t bytes_stored_ = 0;
  std::shared_ptr<LoraTargets> lora_targets_;
  int64_t cast_tensors_ = 0;
  uint64_t cast_compute_bytes_ = 0;
  uint64_t cast_storage_bytes_ = 0;
};

struct BuildOptions {
  std::string dtype = "fp32";  // compute dtype: fp32 | bf16 | fp16
  std::string device = "cpu";
  checkpoint::LoadMode mode = checkpoint::LoadMode::ShardOnLoad;
  LoadFilter wanted;  // see LoadFilter
  // Layerwise casting (ModelOptions::memory.layerwise_storage): the storage
  // dtype, "" = off, "float8_e4m3fn" | "float8_e5m2". `layerwise_skip`: the
  // patterns in force (RE2 regexes searched over module names, see
  // layerwise_casting_skipped).
  std::string layerwise_storage;
  std::vector<std::string> layerwise_skip;
  // Offload and device map ([memory] offload, device_map with component-
  // relative entries, offload_folder); `component` names the component in
  // messages ("transformer"; "" outside a pipeline).
  memory::MemoryOptions memory;
  std::string component;
};

// diffusers' hooks/layerwise_casting.py DEFAULT_SKIP_MODULES_PATTERN.
const std::vector<std::string>& default_layerwise_casting_skip_patterns();

// The BuildOptions of a load with `options`. `class_skip`: the patterns the
// family's diffusers class adds (its _skip_layerwise_casting_patterns), data
// the family keeps beside its class name; added to the user's patterns, or to
// diffusers' defaults when the user gave none.
BuildOptions build_options(const ModelOptions& options, const std::vector<std::string>& class_skip = {});

// Whether a module is left in the compute dtype under `patterns`, as diffusers'
// _apply_layerwise_casting walks the tree: a module is skipped when some
// pattern re.search-matches its name or the name of a module enclosing it
// ("", "transformer_blocks", "transformer_blocks.0", ...). ConfigError naming
// memory.layerwise_casting.skip and the pattern for one that is not a regex.
bool layerwise_casting_skipped(const std::string& module, const std::vector<std::string>& patterns);

// The table of a construction, recorded without touching a checkpoint.
ModelTable record_table(const std::string& cls, const std::function<void(ModelBuilder&)>& declare);

struct BuiltModel {
  ModelTable table;
  uint64_t bytes_read = 0;
  uint64_t bytes_stored = 0;  // resident bytes of the loaded weights
  std::shared_ptr<LoraTargets> lora_targets;  // the loaded Linear layers
};

// Records the table, validates it against `source` at tp.size (tp divisors,
// every wanted tensor present with its shape, split dims and packed blocks
// divisible) before any weight byte is read, checks the TP context, then runs
// `declare` again to load this rank's slices. Closes the source's files.
BuiltModel build_model(const std::string& cls, checkpoint::WeightSource& source, const parallel::TpContext& tp,
                       const BuildOptions& options, const std::function<void(ModelBuilder&)>& declare);

}  // namespace tprun::models
