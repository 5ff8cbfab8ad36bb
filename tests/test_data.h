#pragma once
// Where the tests find tests/data: $TPRUN_SRC (ctest sets it to the source
// folder), else the folder this header sits in.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tprun::test {

inline std::filesystem::path source_dir() {
  if (const char* s = std::getenv("TPRUN_SRC"); s != nullptr && *s != '\0') return s;
  return std::filesystem::path(__FILE__).parent_path().parent_path();
}

// tests/data/<sub>
inline std::filesystem::path data_dir(const std::string& sub) { return source_dir() / "tests" / "data" / sub; }

// A fresh folder under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tprun-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace tprun::test
