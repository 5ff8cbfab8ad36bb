#include "lora/lora_file_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/file_kind.h"

namespace tprun::lora {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

namespace fs = std::filesystem;

std::string lora_file_problem(const std::string& path) {
  if (path.empty()) return "is empty";
  if (!ends_with(fs::path(path).filename().string(), ".safetensors")) {
    return "does not end in .safetensors (an adapter is a safetensors file)";
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "does not exist";
    return fmt::format("cannot be read: {}", std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return "is a folder, not a .safetensors file";
  if (!S_ISREG(st.st_mode)) {
    const char* what = special_file_kind(st.st_mode);
    return fmt::format("is not a regular file ({})", what);
  }
  if (::access(path.c_str(), R_OK) != 0) return fmt::format("cannot be read: {}", std::strerror(errno));
  return "";
}

void check_lora_file(const std::string& path, const std::string& what) {
  if (const std::string why = lora_file_problem(path); !why.empty()) {
    throw ConfigError(fmt::format("{} {}: {}", what, clip_text(path, 512), why), true);
  }
}

}  // namespace tprun::lora
