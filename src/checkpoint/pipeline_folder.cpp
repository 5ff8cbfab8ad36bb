#include "checkpoint/pipeline_folder.h"

#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/strict_json.h"
#include "runtime/error.h"

namespace tprun::checkpoint {
namespace fs = std::filesystem;

namespace {

// A component's folder name: letters, digits, '_' and '-' only, so it can
// never be a path ("..", "a/b", an absolute path) leaving the pipeline folder.
bool plain_name(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (unsigned char ch : s)
    if (!std::isalnum(ch) && ch != '_' && ch != '-') return false;
  return true;
}

// A Python identifier in ASCII (a library or class name).
bool identifier(const std::string& s) {
  if (s.empty() || s.size() > 128 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (unsigned char ch : s)
    if (!std::isalnum(ch) && ch != '_') return false;
  return true;
}

}  // namespace

const PipelineComponent* PipelineFolder::find(const std::string& name) const {
  for (const auto& c : components)
    if (c.name == name) return &c;
  return nullptr;
}

bool is_pipeline_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "model_index.json", ec);
}

PipelineFolder open_pipeline_folder(const std::string& path) {
  PipelineFolder p;
  p.path = path;
  const std::string file = (fs::path(path) / "model_index.json").string();
  p.index = read_json_file(file, "model_index.json");
  if (!p.index.is_object()) throw CheckpointError(fmt::format("{}: must be a JSON object", file));
  if (p.index.contains("_class_name") && p.index["_class_name"].is_string())
    p.cls = p.index["_class_name"].get<std::string>();
  for (auto it = p.index.begin(); it != p.index.end(); ++it) {
    if (it.key().empty() || it.key()[0] == '_') continue;
    const auto& v = it.value();
    if (!v.is_array()) continue;  // pipeline options such as "requires_safety_checker"
    if (v.size() != 2) {
      throw CheckpointError(fmt::format("{}: component '{}' must be [library, class], found {}", file,
                                        it.key(), v.dump()));
    }
    if (v[0].is_null() && v[1].is_null()) continue;  // component not present
    if (!v[0].is_string() || !v[1].is_string()) {
      throw CheckpointError(fmt::format("{}: component '{}' must be [library, class], found {}", file,
                                        it.key(), v.dump()));
    }
    if (!plain_name(it.key())) {
      throw CheckpointError(fmt::format("{}: component name '{}' is not a plain folder name (letters, digits, '_', '-')",
                                        file, clip_text(it.key())),
                            true);
    }
    for (size_t k = 0; k < 2; ++k) {
      if (!identifier(v[k].get<std::string>())) {
        throw CheckpointError(fmt::format("{}: component '{}' {} '{}' is not a {} name", file, it.key(),
                                          k == 0 ? "library" : "class", clip_text(v[k].get<std::string>()),
                                          k == 0 ? "Python module" : "Python class"),
                              true);
      }
    }
    PipelineComponent c;
    c.name = it.key();
    c.library = v[0].get<std::string>();
    c.cls = v[1].get<std::string>();
    c.path = (fs::path(path) / c.name).string();
    std::error_code ec;
    if (!fs::is_directory(c.path, ec)) {
      throw CheckpointError(fmt::format("{}: component '{}' ({}) has no folder {}", file, c.name, c.cls, c.path));
    }
    p.components.push_back(std::move(c));
  }
  return p;
}

}  // namespace tprun::checkpoint
