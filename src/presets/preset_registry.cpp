#include "presets/preset_registry.h"

#include <algorithm>

namespace tprun::presets {

namespace {

// In registration order; preset_archs() orders the families.
std::vector<PresetArch>& registry() {
  static std::vector<PresetArch> r;
  return r;
}

}  // namespace

namespace detail {
bool register_preset(PresetArch arch) {
  registry().push_back(std::move(arch));
  return true;
}
}  // namespace detail

std::vector<PresetArch> preset_archs() {
  // The order of static initialisation across files is unspecified: families
  // by name, and within one file (one family) the order of its registrations.
  std::vector<PresetArch> archs = registry();
  std::stable_sort(archs.begin(), archs.end(),
                   [](const PresetArch& a, const PresetArch& b) { return a.family < b.family; });
  return archs;
}

const PresetArch* find_preset_arch(const std::string& arch) {
  for (const auto& a : registry()) {
    if (a.arch == arch) return &a;
  }
  return nullptr;
}

}  // namespace tprun::presets
