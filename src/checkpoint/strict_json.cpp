#include "checkpoint/strict_json.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::checkpoint {

nlohmann::json parse_strict_json(std::string_view text, const std::string& file, const std::string& what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::vector<std::string> owner;           // the key whose value each open object is
  std::string last_key, duplicate, duplicate_in;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (depth >= 64) throw CheckpointError(fmt::format("{}: {} nests deeper than 64 levels", file, what));
    if (event == E::object_start) {
      keys.emplace_back();
      owner.push_back(keys.size() > 1 ? last_key : "");
    } else if (event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
      if (!owner.empty()) owner.pop_back();
    } else if (event == E::key && !keys.empty()) {
      last_key = parsed.get<std::string>();
      if (!keys.back().insert(last_key).second && duplicate.empty()) {
        duplicate = last_key;
        duplicate_in = owner.empty() ? "" : owner.back();
      }
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: {} is not valid JSON: {}", file, what, e.what()));
  }
  if (!duplicate.empty()) {
    throw CheckpointError(fmt::format("{}: {} has the key '{}' twice{}", file, what, duplicate,
                                      duplicate_in.empty() ? "" : fmt::format(" (in '{}')", duplicate_in)));
  }
  return j;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("{}: cannot open {}", path, what));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_strict_json(ss.str(), path, what);
}

}  // namespace tprun::checkpoint
