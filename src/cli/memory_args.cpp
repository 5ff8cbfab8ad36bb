#include "cli/memory_args.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "jobs/manifest.h"
#include "runtime/error.h"

namespace tprun::cli {
namespace po = boost::program_options;

void add_memory_option(po::options_description& desc) {
  po::options_description m("Memory");
  m.add_options()("memory", po::value<std::vector<std::string>>()->composing(),
                  "KEY=VALUE, repeatable: a key of the manifest's [memory] table (vae_slicing, vae_tiling, "
                  "vae_tile_sample_size, vae_tile_overlap, attention_chunk, layerwise_casting), the value read as TOML");
  desc.add(m);
}

memory::MemoryOptions memory_from(const po::variables_map& vm) {
  std::vector<jobs::Override> settings;
  if (vm.count("memory")) {
    for (const auto& text : vm["memory"].as<std::vector<std::string>>()) {
      const size_t eq = text.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw ConfigError(fmt::format("--memory '{}': expected KEY=VALUE, e.g. vae_tiling=true", text), true);
      }
      settings.emplace_back(text.substr(0, eq), text.substr(eq + 1));
    }
  }
  return jobs::parse_memory_overrides(settings);
}

}  // namespace tprun::cli
