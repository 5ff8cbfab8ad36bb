#pragma once
// Reading a component's config.json: typed fields with defaults, every value
// treated as untrusted. Each reader names the file and the field in its
// CheckpointError; sizes are bounded (plausible caps, block counts against
// the checkpoint's tensor names, overflow-checked products) before any table
// or tensor is built. Torch-free and checkpoint-free except census_of and
// read_component_config (model_config_source.cpp): tests/fuzz builds the rest.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

// The largest size a config.json may give one dimension (2^31): larger
// values are refused before any shape product is formed.
constexpr int64_t kMaxConfigDim = int64_t{1} << 31;
// Plausible caps, far above any released model (the largest have ~128 layers,
// 128 heads, widths of 16k-53k, vocabularies of 256k) and far below what would
// cost a table measurable time or memory.
constexpr int64_t kMaxConfigLayers = 1024;            // blocks of one kind
constexpr int64_t kMaxConfigHeads = 4096;             // attention heads
constexpr int64_t kMaxConfigWidth = int64_t{1} << 20;  // hidden sizes, head dims, channels
constexpr int64_t kMaxConfigVocab = int64_t{1} << 24;  // vocabulary rows, positions

// The tensor names a checkpoint holds, so that a config's block counts are
// checked against what is there before a table is recorded.
class TensorCensus {
 public:
  // `source`: the checkpoint's name for messages.
  TensorCensus(std::vector<std::string> names, std::string source);
  // The number of distinct block indices i among names "<prefix>.<i>" or
  // "<prefix>.<i>.<rest>" (i all digits): 19 for "transformer_blocks" of FLUX.1-dev.
  int64_t blocks(const std::string& prefix) const;
  // The largest of blocks() over `prefixes` (alternative layouts).
  int64_t blocks(const std::vector<std::string>& prefixes) const;
  const std::string& source() const { return source_; }

 private:
  std::vector<std::string> names_;  // sorted
  std::string source_;
};

// An integer field; nullopt when absent or null.
std::optional<int64_t> config_int_or_null(const nlohmann::json& config, const std::string& field,
                                          const std::string& config_path);
// A required integer field.
int64_t config_int(const nlohmann::json& config, const std::string& field, const std::string& config_path);
// A positive integer field, at most `max`; `fallback` when absent or null.
int64_t config_positive(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                        int64_t fallback, int64_t max = kMaxConfigDim);
// out_channels as diffusers' transformers read it, `out_channels or
// in_channels`: 16 when the field is absent, in_channels when null or 0, else
// positive and at most kMaxConfigWidth (Qwen-Image's and Wan's transformers).
int64_t config_out_channels(const nlohmann::json& config, const std::string& config_path, int64_t in_channels);
// A required positive integer field, at most `max`.
int64_t config_positive_required(const nlohmann::json& config, const std::string& field,
                                 const std::string& config_path, int64_t max = kMaxConfigDim);
// A block count (num_layers, num_single_layers, num_hidden_layers,
// layers_per_block, ...): in [min, max]; with a census, at most the blocks the
// checkpoint holds under `prefixes` (less `held_extra`: the VAE decoder holds
// layers_per_block + 1 resnets per level), checked first, so that
// "num_single_layers is 2000000000 but <checkpoint> holds 1 block
// 'single_transformer_blocks.<i>'". `fallback` when absent or null.
int64_t config_block_count(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                           int64_t fallback, const TensorCensus* census, const std::vector<std::string>& prefixes,
                           int64_t min = 0, int64_t held_extra = 0, int64_t max = kMaxConfigLayers);
// The product of config sizes, overflow-checked: CheckpointError naming every
// factor (field and value) when it exceeds `max` ("num_attention_heads 4096 x
// attention_head_dim 4096 = ... is more than ...").
int64_t config_product(const std::string& config_path, const std::vector<std::pair<std::string, int64_t>>& factors,
                       int64_t max = kMaxConfigDim);
// A number (integer or float); `fallback` when absent or null.
double config_number_or(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                        double fallback);
// A finite number in (0, max]; `fallback` when absent or null.
double config_positive_number(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                              double fallback, double max);
std::string config_string_or(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                             const std::string& fallback);
bool config_bool_or(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                    bool fallback);
// A list of positive integers (each at most `max`, at most `max_len` of
// them); `fallback` when absent or null.
std::vector<int64_t> config_int_list_or(const nlohmann::json& config, const std::string& field,
                                        const std::string& config_path, const std::vector<int64_t>& fallback,
                                        size_t max_len = 64, int64_t max = kMaxConfigDim);

// The class a config describes: diffusers' "_class_name", else transformers'
// "architectures"[0]; "" when neither is a string.
std::string config_class(const nlohmann::json& config);

// The tensor names of `source`.
TensorCensus census_of(const checkpoint::WeightSource& source);

// The component's config.json: from an HDF5 checkpoint's attribute or the
// folder's config.json; `config_path` receives a name for messages.
nlohmann::json read_component_config(const std::string& path, std::string* config_path);

}  // namespace tprun::models
