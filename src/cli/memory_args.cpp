#include "cli/memory_args.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memory/memory_table.h"

namespace tprun::cli {
namespace po = boost::program_options;

void add_memory_option(po::options_description& desc) {
  po::options_description m("Memory");
  const std::string help = fmt::format(
      "KEY=VALUE, repeatable: a key of the manifest's [memory] table ({}), the value read as TOML",
      fmt::join(memory::memory_keys(), ", "));
  m.add_options()("memory", po::value<std::vector<std::string>>()->composing(), help.c_str());
  desc.add(m);
}

memory::MemoryOptions memory_from(const po::variables_map& vm) {
  if (!vm.count("memory")) return memory::parse_memory_flags({});
  return memory::parse_memory_flags(vm["memory"].as<std::vector<std::string>>());
}

}  // namespace tprun::cli
