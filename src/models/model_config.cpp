#include "models/model_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

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

TensorCensus::TensorCensus(std::vector<std::string> names, std::string source)
    : names_(std::move(names)), source_(std::move(source)) {
  std::sort(names_.begin(), names_.end());
}

int64_t TensorCensus::blocks(const std::string& prefix) const {
  const std::string head = prefix + ".";
  int64_t count = 0;
  std::string last;
  // Every name under "<prefix>." is in one run of the sorted list, and the
  // names of one block index are adjacent within it ("b.1." < "b.10").
  for (auto it = std::lower_bound(names_.begin(), names_.end(), head);
       it != names_.end() && it->compare(0, head.size(), head) == 0; ++it) {
    const size_t end = std::min(it->find('.', head.size()), it->size());
    if (end == head.size() || it->find_first_not_of("0123456789", head.size()) < end) continue;
    const std::string index = it->substr(head.size(), end - head.size());
    if (count > 0 && index == last) continue;
    last = index;
    ++count;
  }
  return count;
}

int64_t TensorCensus::blocks(const std::vector<std::string>& prefixes) const {
  int64_t most = 0;
  for (const auto& p : prefixes) most = std::max(most, blocks(p));
  return most;
}

int64_t config_block_count(const nlohmann::json& c, const std::string& field, const std::string& path,
                           int64_t fallback, const TensorCensus* census, const std::vector<std::string>& prefixes,
                           int64_t min, int64_t held_extra, int64_t max) {
  const int64_t v = config_int_or_null(c, field, path).value_or(fallback);
  if (census != nullptr && !prefixes.empty()) {
    const int64_t held = std::max<int64_t>(census->blocks(prefixes) - held_extra, 0);
    if (v > held) {
      std::string where = "'" + prefixes.front() + ".<i>'";
      for (size_t i = 1; i < prefixes.size(); ++i) where += " or '" + prefixes[i] + ".<i>'";
      throw CheckpointError(fmt::format("{}: field '{}' is {} but {} holds {} such block{} ({}{})", path, field, v,
                                        census->source(), held, held == 1 ? "" : "s", where,
                                        held_extra ? fmt::format(", {} more than the field counts", held_extra)
                                                   : std::string()));
    }
  }
  if (v < min || v > max) {
    throw CheckpointError(fmt::format("{}: field '{}' = {} is out of range [{}, {}]", path, field, v, min, max));
  }
  return v;
}

int64_t config_product(const std::string& path, const std::vector<std::pair<std::string, int64_t>>& factors,
                       int64_t max) {
  int64_t product = 1;
  bool over = false;
  for (const auto& f : factors) {
    if (f.second < 0 || __builtin_mul_overflow(product, f.second, &product) || product > max) over = true;
    if (over) break;
  }
  if (!over) return product;
  std::string terms;
  for (const auto& f : factors) terms += fmt::format("{}{} {}", terms.empty() ? "" : " x ", f.first, f.second);
  throw CheckpointError(fmt::format("{}: {} is more than {} (or not a size); refusing", path, terms, max));
}

int64_t config_positive(const nlohmann::json& c, const std::string& field, const std::string& path, int64_t fallback,
                        int64_t max) {
  return check_positive(config_int_or_null(c, field, path).value_or(fallback), field, path, max);
}

int64_t config_out_channels(const nlohmann::json& c, const std::string& path, int64_t in_channels) {
  if (!c.contains("out_channels")) return 16;
  const std::optional<int64_t> v = config_int_or_null(c, "out_channels", path);
  if (!v || *v == 0) return in_channels;
  return config_positive(c, "out_channels", path, in_channels, kMaxConfigWidth);
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

}  // namespace tprun::models
