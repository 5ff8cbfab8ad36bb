#include "models/model_config.h"

#include <cmath>

#include <fmt/format.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "runtime/error.h"

namespace tprun::models {

std::optional<int64_t> config_int_or_null(const nlohmann::json& c, const std::string& field, const std::string& path) {
  if (!c.is_object()) throw CheckpointError(fmt::format("{}: config must be a JSON object", path));
  if (!c.contains(field) || c[field].is_null()) return std::nullopt;
  const auto& v = c[field];
  if (!v.is_number_integer()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be an integer, found {}", path, field, v.dump()));
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw CheckpointError(fmt::format("{}: field '{}' = {} is out of range", path, field, v.dump()));
  }
  return v.get<int64_t>();
}

int64_t config_int(const nlohmann::json& c, const std::string& field, const std::string& path) {
  auto v = config_int_or_null(c, field, path);
  if (!v) throw CheckpointError(fmt::format("{}: required field '{}' is missing", path, field));
  return *v;
}

namespace {

int64_t check_positive(int64_t v, const std::string& field, const std::string& path, int64_t max) {
  if (v <= 0) throw CheckpointError(fmt::format("{}: field '{}' must be positive, got {}", path, field, v));
  if (v > max) {
    throw CheckpointError(fmt::format("{}: field '{}' = {} is implausibly large (at most {})", path, field, v, max));
  }
  return v;
}

}  // namespace

int64_t config_positive(const nlohmann::json& c, const std::string& field, const std::string& path, int64_t fallback,
                        int64_t max) {
  return check_positive(config_int_or_null(c, field, path).value_or(fallback), field, path, max);
}

int64_t config_positive_required(const nlohmann::json& c, const std::string& field, const std::string& path,
                                 int64_t max) {
  return check_positive(config_int(c, field, path), field, path, max);
}

double config_number_or(const nlohmann::json& c, const std::string& field, const std::string& path, double fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_number()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a number, found {}", path, field, c[field].dump()));
  }
  return c[field].get<double>();
}

double config_positive_number(const nlohmann::json& c, const std::string& field, const std::string& path,
                              double fallback, double max) {
  const double v = config_number_or(c, field, path, fallback);
  if (!std::isfinite(v) || v <= 0 || v > max) {
    throw CheckpointError(fmt::format("{}: field '{}' = {} must be a positive number of at most {}", path, field, v,
                                      max));
  }
  return v;
}

std::string config_string_or(const nlohmann::json& c, const std::string& field, const std::string& path,
                             const std::string& fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_string()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a string, found {}", path, field, c[field].dump()));
  }
  return c[field].get<std::string>();
}

bool config_bool_or(const nlohmann::json& c, const std::string& field, const std::string& path, bool fallback) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  if (!c[field].is_boolean()) {
    throw CheckpointError(fmt::format("{}: field '{}' must be true or false, found {}", path, field, c[field].dump()));
  }
  return c[field].get<bool>();
}

std::vector<int64_t> config_int_list_or(const nlohmann::json& c, const std::string& field, const std::string& path,
                                        const std::vector<int64_t>& fallback, size_t max_len, int64_t max) {
  if (!c.contains(field) || c[field].is_null()) return fallback;
  const auto& v = c[field];
  if (!v.is_array() || v.empty() || v.size() > max_len) {
    throw CheckpointError(fmt::format("{}: field '{}' must be a list of 1 to {} integers", path, field, max_len));
  }
  std::vector<int64_t> out;
  for (const auto& e : v) {
    if (!e.is_number_integer()) {
      throw CheckpointError(fmt::format("{}: field '{}' must hold integers, found {}", path, field, e.dump()));
    }
    out.push_back(check_positive(e.get<int64_t>(), field, path, max));
  }
  return out;
}

std::string config_class(const nlohmann::json& c) {
  if (!c.is_object()) return "";
  if (c.contains("_class_name") && c["_class_name"].is_string()) return c["_class_name"].get<std::string>();
  if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty() &&
      c["architectures"][0].is_string()) {
    return c["architectures"][0].get<std::string>();
  }
  return "";
}

nlohmann::json read_component_config(const std::string& path, std::string* config_path) {
  if (checkpoint::is_hdf5_file(path)) {
    if (config_path) *config_path = path + " (config attribute)";
    return checkpoint::hdf5_config(path);
  }
  auto ck = checkpoint::ComponentCheckpoint::open(path);
  if (config_path) *config_path = path + "/config.json";
  return ck.config();
}

}  // namespace tprun::models
