#pragma once
// The tiny pipeline folder of an init-model architecture ("flux",
// "flux2-klein", "flux2-dev"), written once per test binary through the
// preset registry, in a temporary folder removed at exit.
#include <map>
#include <stdexcept>
#include <string>

#include "presets/preset_registry.h"
#include "test_data.h"

namespace tprun::test {

inline std::string tiny_folder(const std::string& arch) {
  static TempDir tmp;
  static std::map<std::string, std::string> written;
  auto it = written.find(arch);
  if (it != written.end()) return it->second;
  const presets::PresetArch* a = presets::find_preset_arch(arch);
  if (!a) throw std::runtime_error("no init-model architecture " + arch);
  const std::string dir = tmp / arch;
  a->resolve(arch, "tiny").write(dir, 0, false);
  return written[arch] = dir;
}

}  // namespace tprun::test
