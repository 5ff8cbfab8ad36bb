#pragma once
// Reading a component's config.json: typed fields with defaults, every value
// treated as untrusted. Each reader names the file and the field in its
// CheckpointError; sizes are bounded before any table or tensor is built.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tprun::models {

// The largest size a config.json may give one dimension (2^31): larger
// values are refused before any shape product is formed.
constexpr int64_t kMaxConfigDim = int64_t{1} << 31;

// An integer field; nullopt when absent or null.
std::optional<int64_t> config_int_or_null(const nlohmann::json& config, const std::string& field,
                                          const std::string& config_path);
// A required integer field.
int64_t config_int(const nlohmann::json& config, const std::string& field, const std::string& config_path);
// A positive integer field, at most `max`; `fallback` when absent or null.
int64_t config_positive(const nlohmann::json& config, const std::string& field, const std::string& config_path,
                        int64_t fallback, int64_t max = kMaxConfigDim);
// A required positive integer field, at most `max`.
int64_t config_positive_required(const nlohmann::json& config, const std::string& field,
                                 const std::string& config_path, int64_t max = kMaxConfigDim);
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

// The component's config.json: from an HDF5 checkpoint's attribute or the
// folder's config.json; `config_path` receives a name for messages.
nlohmann::json read_component_config(const std::string& path, std::string* config_path);

}  // namespace tprun::models
