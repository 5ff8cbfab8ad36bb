// `tprun init-model DIR --arch A`: a complete diffusers-layout pipeline folder
// with random weights and tokenizers learned from the bundled corpus, for demos
// and tests without a download. The architectures are those the pipeline
// families register (presets/preset_registry.h).
#include <algorithm>
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/command.h"
#include "presets/preset_registry.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

// "pipeline architecture: flux (FLUX.1, FluxPipeline), flux2-klein (...), ..."
std::string arch_help() {
  std::vector<std::string> entries;
  for (const auto& a : presets::preset_archs()) entries.push_back(fmt::format("{} ({})", a.arch, a.help));
  return fmt::format("pipeline architecture: {}", fmt::join(entries, ", "));
}

// "model sizes: tiny or small": every preset name some architecture has.
std::string preset_help() {
  std::vector<std::string> names;
  for (const auto& a : presets::preset_archs()) {
    for (const auto& n : a.preset_names) {
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  if (names.size() < 2) return fmt::format("model sizes: {}", fmt::join(names, ""));
  const std::string last = names.back();
  names.pop_back();
  return fmt::format("model sizes: {} or {}", fmt::join(names, ", "), last);
}

// ConfigError naming the registered architectures for an unknown one.
const presets::PresetArch& arch_named(const std::string& arch) {
  if (const auto* a = presets::find_preset_arch(arch)) return *a;
  std::vector<std::string> known;
  for (const auto& a : presets::preset_archs()) known.push_back(a.arch);
  throw ConfigError(fmt::format("--arch '{}' is not known ({})", arch, fmt::join(known, ", ")));
}

}  // namespace

Command init_model_command() {
  Command c;
  c.name = "init-model";
  c.summary = "write a pipeline folder with random weights and its own tokenizers (no download)";
  c.usage = "DIR";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Init model");
    const std::string arch = arch_help(), preset = preset_help();
    o.add_options()
        ("dir", po::value<std::string>()->required(), "output folder (diffusers layout)")
        ("arch", po::value<std::string>()->required(), arch.c_str())
        ("preset", po::value<std::string>()->default_value("tiny"), preset.c_str())
        ("seed", po::value<uint64_t>()->default_value(0), "seed of the random weights")
        ("force", po::bool_switch(), "replace DIR when it exists and is not empty");
    desc.add(o);
    pos.add("dir", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    auto env = rank_env_from_variables(process_env());
    init_logging({env ? env->rank : 0, env ? env->world : 1, "", ""});
    const std::string dir = vm["dir"].as<std::string>(), arch = vm["arch"].as<std::string>();
    const std::string preset = vm["preset"].as<std::string>();
    const uint64_t seed = vm["seed"].as<uint64_t>();
    presets::ResolvedPreset p;
    presets::WrittenPreset w;
    const auto start = std::chrono::steady_clock::now();
    try {
      p = arch_named(arch).resolve(arch, preset);  // on every rank: a bad --arch or --preset fails on all
      if (env && env->rank != 0) return 0;         // one writer; the others have nothing to do
      w = p.write(dir, seed, vm["force"].as<bool>());
    } catch (const Error& e) {
      rethrow_on_all_ranks(e);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("wrote {} (seed {}) to {}: {} tensors, {}; {} in {:.1f} s\n", p.what, seed, dir,
                             w.summary.tensors, format_size(static_cast<uint64_t>(w.summary.bytes)), w.details, secs);
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
