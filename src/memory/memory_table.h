#pragma once
// The [memory] table (memory_options.h) as a job manifest holds it and as
// `--memory KEY=VALUE` (generate, forward, verify, bench) sets it: one reader
// for both, with file:line or the flag in every message (runtime/strict_toml.h).

#include <string>
#include <vector>

#include "memory/memory_options.h"
#include "runtime/strict_toml.h"

namespace tprun::memory {

// Every key the [memory] table may hold, in the order --memory's help lists them: the keys the
// reader below knows, and the list `--memory`'s help shows.
const std::vector<std::string>& memory_keys();

// Reads the manifest's [memory] `table` into `mo`. ConfigError
// "<where>: memory.<key>...: ..." (on every rank) for an unknown key, a wrong
// type or value, or offload_folder without a device map.
void read_memory_table(const TomlDoc& doc, const toml::table& table, MemoryOptions& mo);

// The `--memory` texts ("vae_tiling=true", "offload={type=\"leaf_level\"}"),
// each value read as TOML as the manifest's --set reads it. ConfigError
// "--memory '<text>': ..." for a text that is not KEY=VALUE or a value that
// opens a table, an array or a quoted string and is not valid TOML;
// "--memory <key>: ..." for a bad setting; identically on every rank.
MemoryOptions parse_memory_flags(const std::vector<std::string>& texts);

}  // namespace tprun::memory
