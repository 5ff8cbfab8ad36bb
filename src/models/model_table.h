#pragma once
// Models as data: the table of a model names every tensor it has (exactly as
// diffusers / transformers save it), its shape computed from config.json, what
// kind of parameter it is and its tensor-parallel style. A table is the record
// of a model's construction (models/model_builder.h): the construction code
// declares each tensor once, and the table that loading, validation,
// `tprun inspect`, `tprun init-model` and the parity tests read is what those
// declarations recorded, built without reading a byte.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/shard_style.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

// What a tensor is, for the rules that depend on it (random init in
// init-model, layerwise casting skips).
// Counter: an integer buffer (BatchNorm's num_batches_tracked), stored as I64.
enum class TensorKind { Linear, Conv, Embedding, Norm, Bias, Buffer, Counter };
const char* tensor_kind_name(TensorKind kind);

struct TensorSpec {
  std::string name;            // "transformer_blocks.0.attn.to_q.weight"
  std::vector<int64_t> shape;  // from config.json
  TensorKind kind = TensorKind::Linear;
  checkpoint::ShardStyle style = checkpoint::ShardStyle::Replicated;
  std::vector<int64_t> blocks;  // packed styles: absolute block sizes along the split dim
  // The tp plan key the tensor's module falls under (diffusers' _tp_plan
  // form: the block index as '*', "transformer_blocks.*.attn.to_q"), for
  // every tensor of a planned module (a row-wise bias too); "" = not planned.
  std::string plan_key;
  bool optional = false;  // may be absent from a checkpoint; never loaded (a buffer, a tied copy, a part never run)
  // save_pretrained writes it (so `tprun init-model` does): false for tied
  // copies and non-persistent buffers.
  bool saved = true;
  std::string dtype;      // "" = the model's compute dtype; "fp32" = kept in fp32 whatever it is
};

// A tensor-parallel plan as data, as diffusers' _tp_plan reads: module
// patterns with at most one '*' (one block index) and their styles.
struct PlanEntry {
  std::string pattern;  // "transformer_blocks.*.attn.to_q"
  checkpoint::ShardStyle style = checkpoint::ShardStyle::Replicated;
  std::vector<int64_t> blocks;  // packed: absolute sizes along the split dim
};
using TpPlan = std::vector<PlanEntry>;

// A size that tp must divide ("num_attention_heads" 24).
struct TpDivisor {
  std::string field;
  int64_t value = 0;
};

struct ModelTable {
  std::string cls;                  // "FluxTransformer2DModel"
  std::vector<TensorSpec> tensors;  // in declaration (module) order
  std::vector<TpDivisor> tp_divisors;

  // nullptr when the table has no such tensor.
  const TensorSpec* find(const std::string& name) const;
  // The tensor's ShardRequest at (tp_rank, tp_size). CheckpointError naming
  // the tensor and the class for a name the table does not hold: a tensor is
  // never silently taken as replicated.
  checkpoint::ShardRequest request(const std::string& name, int tp_rank, int tp_size) const;
  // The plan the table's tensors follow: one entry per plan key, in order of
  // first use. Internal error if two modules of one key differ in style.
  TpPlan tp_plan() const;
  // Bytes of every tensor at `bytes_per_element`, and of one TP rank's share.
  uint64_t total_bytes(int bytes_per_element) const;
};

// The plan key of a module: its first all-digit component (a block index)
// replaced by '*' ("single_transformer_blocks.3.attn.to_out" ->
// "single_transformer_blocks.*.attn.to_out"); the module itself when it has none.
std::string plan_key_of(const std::string& module);

// Validation of a table (and its plan) against a checkpoint before any weight
// byte is read: tp divides every TpDivisor (ConfigError naming both), every
// non-optional tensor exists with the table's shape (CheckpointError naming
// the tensor and both shapes), every split dim and packed block divides by tp
// (ConfigError naming tensor, size and tp). Reads only headers.
void validate_tp_plan(const ModelTable& table, const checkpoint::WeightSource& source, int tp_size);
// The tp-only part of it (no checkpoint): divisors, split dims, packed blocks.
void validate_tp_size(const ModelTable& table, int tp_size, const std::string& where);

}  // namespace tprun::models
