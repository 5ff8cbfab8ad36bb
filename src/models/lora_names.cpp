#include "models/lora_names.h"

#include <map>

namespace tprun::models {
namespace {

std::map<std::string, LoraNamesFn>& registry() {
  static std::map<std::string, LoraNamesFn> r;  // constructed on first use (static init order safe)
  return r;
}

}  // namespace

namespace detail {
bool register_lora_names(const char* cls, LoraNamesFn fn) {
  registry()[cls] = std::move(fn);
  return true;
}
}  // namespace detail

LoraNames lora_names_for(const std::string& cls, const nlohmann::json& config, const std::string& config_path) {
  auto it = registry().find(cls);
  if (it == registry().end()) return {};
  return it->second(config, config_path);
}

bool has_lora_names(const std::string& cls) { return registry().count(cls) != 0; }

std::string expand_block_pattern(const std::string& pattern, int64_t index) {
  const std::string placeholder = "{i}";
  std::string out = pattern;
  const std::string value = std::to_string(index);
  for (size_t at = out.find(placeholder); at != std::string::npos; at = out.find(placeholder, at + value.size())) {
    out.replace(at, placeholder.size(), value);
  }
  return out;
}

}  // namespace tprun::models
