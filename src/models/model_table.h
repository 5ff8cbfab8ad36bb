#pragma once
// Models as data: one table per model class names every tensor it has (exactly
// as diffusers / transformers save it), its shape computed from config.json and
// its tensor-parallel style. The loader, the TP plan, `tprun inspect` and the
// tests all read the same table.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/slice_plan.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

struct TensorSpec {
  std::string name;            // "transformer_blocks.0.attn.to_q.weight"
  std::vector<int64_t> shape;  // from config.json
  checkpoint::ShardStyle style = checkpoint::ShardStyle::Replicated;
  std::vector<int64_t> blocks;  // packed styles: absolute block sizes along the split dim
  std::string plan_key;         // the tp_plan entry it falls under ("" = not planned)
  bool optional = false;        // may be absent (e.g. guidance embedder)
};

struct ModelTable {
  std::string cls;                 // "FluxTransformer2DModel"
  std::vector<TensorSpec> tensors;  // in module order
  int64_t num_attention_heads = 0;  // tp must divide it (0: no head constraint)

  const TensorSpec* find(const std::string& name) const;
  // ShardRequest for `name` at (tp_rank, tp_size); replicated when not planned.
  checkpoint::ShardRequest request(const std::string& name, int tp_rank, int tp_size) const;
};

// The table for a component's config.json ("_class_name", or for transformers
// configs "architectures"[0]), or nullopt for
// classes tprun has no table for. ConfigError / CheckpointError when the
// config is missing fields the table needs (naming the field).
// A tensor-parallel plan as data: module patterns with at most one '*' (the
// part before it names a list of blocks; '*' matches one block index) and
// their styles; packed styles carry absolute block sizes along the split dim.
struct PlanEntry {
  std::string pattern;  // "transformer_blocks.*.attn.to_q"
  checkpoint::ShardStyle style = checkpoint::ShardStyle::Replicated;
  std::vector<int64_t> blocks;
};
using TpPlan = std::vector<PlanEntry>;

// Applies `plan` to `table` (whose tensors start replicated). A module is a
// tensor name without its last component (".weight", ".bias"). Weights take
// the entry's style; biases are split with colwise layers and stay whole for
// the row-wise styles (added once, after the reduce). ConfigError naming the
// key and the class for: a pattern with more than one '*', a key that matches
// no module, a module matched by two keys.
void apply_tp_plan(ModelTable& table, const TpPlan& plan);

// FLUX.1's plan (diffusers' _tp_plan for FluxTransformer2DModel), plus the
// AdaLN modulations as rowwise_split_input when `shard_modulation`.
TpPlan flux_tp_plan(int64_t inner_dim, int64_t mlp_hidden_dim, bool shard_modulation);

struct TableOptions {
  // Shard the AdaLN modulation linears as rowwise_split_input (off by
  // default, as in diffusers' plan).
  bool shard_modulation = false;
};
std::optional<ModelTable> model_table_for(const nlohmann::json& config, const std::string& config_path,
                                          const TableOptions& options = {});

// Registry: tables register a builder for their class name.
using TableBuilder =
    std::function<ModelTable(const nlohmann::json& config, const std::string& config_path, const TableOptions&)>;
bool register_model_table(const std::string& cls, TableBuilder builder);

// Validation of a model table (and its plan) against the checkpoint, before any weight byte is
// read: tp divides num_attention_heads (ConfigError naming both), every
// tensor of the table exists with the table's shape (CheckpointError naming
// the tensor and both shapes), every split dim and packed block divides by tp
// (ConfigError naming tensor, size and tp). Reads only headers.
void validate_tp_plan(const ModelTable& table, const checkpoint::WeightSource& source, int tp_size);

// Reads an integer field of config.json; CheckpointError naming file and field.
int64_t config_int(const nlohmann::json& config, const std::string& field, const std::string& config_path);
// An optional positive integer field: `fallback` when absent or null;
// CheckpointError naming file and field when not a positive integer.
int64_t config_positive(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                        int64_t fallback);
std::optional<int64_t> config_int_or_null(const nlohmann::json& config, const std::string& field,
                                          const std::string& config_path);

}  // namespace tprun::models
