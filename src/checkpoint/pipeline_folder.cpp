#include "checkpoint/pipeline_folder.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

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

// model_index.json's "_class_name": the pipeline class, a non-empty string.
std::string pipeline_class_of(const nlohmann::json& index, const std::string& file) {
  auto it = index.find("_class_name");
  if (it == index.end()) {
    throw CheckpointError(fmt::format("{}: _class_name is missing; a diffusers pipeline folder names its pipeline "
                                      "class there (e.g. \"FluxPipeline\")",
                                      file),
                          true);
  }
  if (!it->is_string()) {
    throw CheckpointError(fmt::format("{}: _class_name is not a string (found {}); it names the pipeline class "
                                      "(e.g. \"FluxPipeline\")",
                                      file, clip_text(it->dump())),
                          true);
  }
  std::string cls = it->get<std::string>();
  if (cls.empty()) {
    throw CheckpointError(fmt::format("{}: _class_name is empty; it names the pipeline class (e.g. \"FluxPipeline\")",
                                      file),
                          true);
  }
  return cls;
}

}  // namespace

const PipelineComponent* PipelineFolder::find(const std::string& name) const {
  for (const auto& c : components)
    if (c.name == name) return &c;
  return nullptr;
}

bool is_pipeline_folder(const std::string& path) {
  const std::string file = (fs::path(path) / "model_index.json").string();
  struct stat st {};
  int rc = 0;
  do {
    rc = ::stat(file.c_str(), &st);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    // Only "no such file" means "not a pipeline folder"; any other failure
    // (a symlink loop, EIO, EACCES on a folder, ENOMEM...) is said as it is,
    // never reported as a missing model_index.json.
    if (errno == ENOENT || errno == ENOTDIR) return false;
    throw_io_error("cannot tell whether this is a pipeline folder: stat", file, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    throw CheckpointError(fmt::format("{}: model_index.json is not a regular file (a {}); a diffusers pipeline "
                                      "folder has a model_index.json file naming its components",
                                      file, S_ISDIR(st.st_mode) ? "folder" : "special file"),
                          true);
  }
  return true;
}

PipelineFolder open_pipeline_folder(const std::string& path) {
  PipelineFolder p;
  p.path = path;
  const std::string file = (fs::path(path) / "model_index.json").string();
  p.index = read_json_file(file, "model_index.json");
  if (!p.index.is_object()) throw CheckpointError(fmt::format("{}: must be a JSON object", file));
  p.cls = pipeline_class_of(p.index, file);
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
