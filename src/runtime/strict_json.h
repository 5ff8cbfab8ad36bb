#pragma once
// JSON read strictly, for every layer: nlohmann-json, plus a rejection of
// duplicate keys at any depth (JSON allows them; a checkpoint header, a config
// or a request line must not have them) and of nesting deeper than 64 levels.
// Torch-free (the fuzz targets compile it). Its errors are CheckpointError.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tprun {

// Throws CheckpointError "<file>: <what> is not valid JSON: ..." or
// "<file>: <what> has the key 'k' twice".
nlohmann::json parse_strict_json(std::string_view text, const std::string& file, const std::string& what);

// Reads and parses a whole (small) JSON file.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace tprun
