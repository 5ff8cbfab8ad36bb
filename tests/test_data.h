#pragma once
// Where the tests find tests/data: $TPRUN_SRC (ctest sets it to the source
// folder), else the folder this header sits in.
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

}  // namespace tprun::test
