#include "cli/memory_args.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
// As in jobs/manifest.cpp: toml++ 3.3's assertions are not for hostile input.
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

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

namespace {

// The manifest's override rule reads a value that is not TOML as a plain string (so that
// `offload.disk_path=/scratch/x` needs no quotes). A value that opens a table, an array or a quoted
// string was meant as TOML, though: a syntax error there must be reported as one, with its column,
// not as the string it fell back to ("'{a=1' is not a strategy").
void check_toml_value(const std::string& option_text, const std::string& key, const std::string& value) {
  const size_t first = value.find_first_not_of(" \t");
  if (first == std::string::npos || std::string("{[\"'").find(value[first]) == std::string::npos) return;
  // Only printable ASCII reaches toml++ here (the manifest's reader guards the rest: toml++ 3.3
  // misbehaves on some non-ASCII input outside strings).
  for (unsigned char c : value) {
    if (c < 0x20 || c >= 0x7f) return;
  }
  const std::string prefix = "v = ";
  try {
    (void)toml::parse(prefix + value);
  } catch (const toml::parse_error& e) {
    const auto column = static_cast<long>(e.source().begin.column) - static_cast<long>(prefix.size());
    throw ConfigError(fmt::format("--memory '{}': the value of {} is not valid TOML: {} (at column {} of the value)",
                                  clip_text(option_text, 200), key, e.description(), std::max(1L, column)),
                      true);
  }
}

}  // namespace

memory::MemoryOptions memory_from(const po::variables_map& vm) {
  std::vector<jobs::Override> settings;
  if (vm.count("memory")) {
    for (const auto& text : vm["memory"].as<std::vector<std::string>>()) {
      const size_t eq = text.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw ConfigError(fmt::format("--memory '{}': expected KEY=VALUE, e.g. vae_tiling=true", text), true);
      }
      settings.emplace_back(text.substr(0, eq), text.substr(eq + 1));
      check_toml_value(text, settings.back().first, settings.back().second);
    }
  }
  return jobs::parse_memory_overrides(settings);
}

}  // namespace tprun::cli
