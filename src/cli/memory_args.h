#pragma once
// `--memory KEY=VALUE` (repeatable) for generate, forward and verify: the
// keys of the manifest's [memory] table, values read as TOML as --set reads
// them (`--memory vae_tiling=true --memory attention_chunk=4096`).

#include <boost/program_options.hpp>

#include "memory/memory_options.h"

namespace tprun::cli {

void add_memory_option(boost::program_options::options_description& desc);
// ConfigError "--memory <key>: ..." for a bad setting, identically on every rank
// (memory/memory_table.h).
memory::MemoryOptions memory_from(const boost::program_options::variables_map& vm);

}  // namespace tprun::cli
