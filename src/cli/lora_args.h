#pragma once
// `--lora FILE [--lora-scale X]` (repeatable: the n-th --lora-scale belongs to
// the n-th --lora, 1.0 where there is none), `--lora-apply auto|fused|runtime`
// and `--lora-strict true|false` for generate and forward: the adapters of a
// manifest's [[loras]] and [lora] table, from the command line.

#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "lora/lora_choice.h"

namespace tprun::cli {

void add_lora_options(boost::program_options::options_description& desc);

struct LoraArgs {
  std::vector<lora::LoraChoice> set;  // paths made absolute
  bool strict = true;
  std::string apply = "auto";
};
// ConfigError "--lora ...: ..." for more scales than adapters, a scale that
// is not finite or out of bounds, a path that is not a regular file, an
// unknown apply mode; identically on every rank.
LoraArgs lora_args_from(const boost::program_options::variables_map& vm);

}  // namespace tprun::cli
