#include "lora/lora_metadata.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <re2/re2.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::lora {
namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw CheckpointError(fmt::format("{}: header metadata '{}': {}", file, kLoraMetadataKey, what), true);
}

using Json = nlohmann::ordered_json;  // keeps the patterns in the file's order, as Python's dicts do

int64_t read_rank(const std::string& file, const std::string& field, const Json& v) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxMetadataRank) {
    fail(file, fmt::format("field '{}' must be an integer in [1, {}], got {}", field, kMaxMetadataRank,
                           clip_text(v.dump())));
  }
  return v.get<int64_t>();
}

double read_alpha(const std::string& file, const std::string& field, const Json& v) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
    fail(file, fmt::format("field '{}' must be a finite positive number, got {}", field, clip_text(v.dump())));
  }
  return v.get<double>();
}

std::vector<LoraPattern> read_patterns(const std::string& file, const std::string& field, const Json& v, bool ranks) {
  if (!v.is_object()) fail(file, fmt::format("field '{}' must be an object, got {}", field, clip_text(v.dump())));
  if (v.size() > kMaxMetadataPatterns) {
    fail(file, fmt::format("field '{}' has {} entries, more than {}", field, v.size(), kMaxMetadataPatterns));
  }
  std::vector<LoraPattern> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string where = fmt::format("{}[{}]", field, clip_text(it.key()));
    LoraPattern p;
    p.key = it.key();
    p.value = ranks ? static_cast<double>(read_rank(file, where, it.value())) : read_alpha(file, where, it.value());
    RE2::Options options;
    options.set_log_errors(false);
    auto re = std::make_shared<RE2>("(.*\\.)?(" + p.key + ")", options);
    if (!re->ok()) fail(file, fmt::format("{} is not a valid regular expression: {}", where, re->error()));
    p.regex = std::move(re);
    out.push_back(std::move(p));
  }
  return out;
}

const LoraPattern* match(const std::vector<LoraPattern>& patterns, const std::string& module) {
  for (const LoraPattern& p : patterns) {
    if (RE2::FullMatch(module, *p.regex)) return &p;
  }
  return nullptr;
}

}  // namespace

int64_t LoraMetadata::rank_for(const std::string& module) const {
  const LoraPattern* p = match(rank_pattern, module);
  return p ? static_cast<int64_t>(p->value) : r;
}

double LoraMetadata::alpha_for(const std::string& module) const {
  const LoraPattern* p = match(alpha_pattern, module);
  return p ? p->value : lora_alpha;
}

double LoraMetadata::scale_for(const std::string& module) const {
  const double rank = static_cast<double>(rank_for(module));
  return alpha_for(module) / (use_rslora ? std::sqrt(rank) : rank);
}

std::map<std::string, LoraMetadata> read_lora_metadata(const std::string& file,
                                                       const std::map<std::string, std::string>& header_metadata) {
  std::map<std::string, LoraMetadata> out;
  auto it = header_metadata.find(kLoraMetadataKey);
  if (it == header_metadata.end()) return out;
  // Strictly first (nesting depth, duplicate keys: CheckpointError naming the
  // file), then again keeping the file's order.
  parse_strict_json(it->second, file, fmt::format("header metadata '{}'", kLoraMetadataKey));
  const Json j = Json::parse(it->second);
  if (!j.is_object()) fail(file, fmt::format("must be a JSON object, got {}", clip_text(j.dump())));
  for (auto f = j.begin(); f != j.end(); ++f) {
    const std::string& key = f.key();
    const size_t dot = key.find('.');
    if (dot == std::string::npos || dot == 0) continue;  // not a component's field
    const std::string component = key.substr(0, dot);
    const std::string field = key.substr(dot + 1);
    const Json& v = f.value();
    LoraMetadata& m = out[component];
    if (field == "r") {
      m.r = read_rank(file, key, v);
    } else if (field == "lora_alpha") {
      m.lora_alpha = read_alpha(file, key, v);
    } else if (field == "use_rslora") {
      if (!v.is_boolean()) {
        fail(file, fmt::format("field '{}' must be true or false, got {}", key, clip_text(v.dump())));
      }
      m.use_rslora = v.get<bool>();
    } else if (field == "rank_pattern") {
      m.rank_pattern = read_patterns(file, key, v, true);
    } else if (field == "alpha_pattern") {
      m.alpha_pattern = read_patterns(file, key, v, false);
    }
  }
  return out;
}

}  // namespace tprun::lora
