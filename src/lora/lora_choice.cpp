#include "lora/lora_choice.h"

#include <fmt/format.h>

namespace tprun::lora {

std::string lora_set_key(const std::vector<LoraChoice>& set) {
  std::string key;
  for (const auto& c : set) {
    // The path's length first, so no path can run into the next entry; the
    // scale as its exact bits (17 significant digits round-trip a double).
    key += fmt::format("{}:{}*{:.17g};", c.path.size(), c.path, c.scale);
  }
  return key;
}

}  // namespace tprun::lora
