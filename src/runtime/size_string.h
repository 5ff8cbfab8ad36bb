#pragma once
// Byte sizes as people write them, the way diffusers' max_shard_size reads
// them: "5GB" (10^9), "500MB", "10GiB" (2^30), "4KiB", "1.5GB", "123" (bytes).
// Units are case-insensitive.

#include <cstdint>
#include <string>

namespace tprun {

// Throws ConfigError naming `option` and the accepted forms.
uint64_t parse_size(const std::string& text, const std::string& option);

// 4096 -> "4 KiB", 1048576 -> "1 MiB", 1500 -> "1500 B".
std::string format_size(uint64_t bytes);

}  // namespace tprun
