#include "cli/lora_args.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "lora/lora_adapters.h"
#include "lora/lora_file_check.h"
#include "runtime/error.h"

namespace po = boost::program_options;

namespace tprun::cli {

void add_lora_options(po::options_description& desc) {
  po::options_description l("LoRA adapters (docs/lora.md)");
  l.add_options()
      ("lora", po::value<std::vector<std::string>>()->composing(),
       "a LoRA adapter .safetensors file (diffusers / PEFT, kohya, ComfyUI / ai-toolkit keys); repeat to stack "
       "several; each rank reads only its slice")
      ("lora-scale", po::value<std::vector<double>>()->composing(),
       "the weight of the n-th --lora (default 1.0)")
      ("lora-apply", po::value<std::string>()->default_value("auto"),
       "auto | fused (W += scale B A into each rank's slice at load) | runtime (low-rank matmuls per step)")
      ("lora-strict", po::value<bool>()->default_value(true),
       "false: adapter keys that map to no module are skipped with a warning instead of refused");
  desc.add(l);
}

LoraArgs lora_args_from(const po::variables_map& vm) {
  LoraArgs a;
  const auto paths = vm.count("lora") ? vm["lora"].as<std::vector<std::string>>() : std::vector<std::string>{};
  const auto scales = vm.count("lora-scale") ? vm["lora-scale"].as<std::vector<double>>() : std::vector<double>{};
  if (scales.size() > paths.size()) {
    throw ConfigError(fmt::format("--lora-scale: {} scales for {} --lora adapters (the n-th scale belongs to the "
                                  "n-th --lora)",
                                  scales.size(), paths.size()),
                      true);
  }
  if (paths.size() > lora::kMaxLorasPerRequest) {
    throw ConfigError(fmt::format("--lora: {} adapters; at most {}", paths.size(), lora::kMaxLorasPerRequest), true);
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    const double scale = i < scales.size() ? scales[i] : 1.0;
    if (!std::isfinite(scale) || std::fabs(scale) > lora::kMaxLoraScale) {
      throw ConfigError(fmt::format("--lora-scale {}: the weight of --lora {} must be finite and within +-{}", scale,
                                    paths[i], lora::kMaxLoraScale),
                        true);
    }
    const std::string& p = paths[i];
    lora::check_lora_file(p, "--lora");
    a.set.push_back({std::filesystem::absolute(p).lexically_normal().string(), scale});
  }
  a.strict = vm["lora-strict"].as<bool>();
  a.apply = vm["lora-apply"].as<std::string>();
  lora::parse_lora_apply(a.apply, "--lora-apply");
  return a;
}

}  // namespace tprun::cli
