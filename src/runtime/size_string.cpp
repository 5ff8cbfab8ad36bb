#include "runtime/size_string.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun {

uint64_t parse_size(const std::string& text, const std::string& option) {
  auto bad = [&] {
    return ConfigError(fmt::format(
        "{} '{}' is not a size; write bytes or a number with KB, MB, GB, TB (powers of 1000) or "
        "KiB, MiB, GiB, TiB (powers of 1024), e.g. 5GB",
        option, text));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw bad();
  const std::string number = text.substr(0, i);
  char* end = nullptr;
  double value = std::strtod(number.c_str(), &end);
  if (end == nullptr || *end != '\0' || !std::isfinite(value)) throw bad();
  std::string unit;
  for (size_t j = i; j < text.size(); ++j) {
    if (text[j] == ' ') continue;
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[j])));
  }
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else if (unit == "KIB") scale = 1024.0;
  else if (unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  else throw bad();
  const double bytes = value * scale;
  if (bytes < 1 || bytes > 9.0e18) {
    throw ConfigError(fmt::format("{} '{}' must be between 1 byte and 9 EB", option, text));
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_size(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t v = bytes;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  if (u == 0 && bytes >= 1024) {
    double d = static_cast<double>(bytes);
    while (u < 4 && d >= 1024) {
      d /= 1024;
      ++u;
    }
    return fmt::format("{:.1f} {}", d, units[u]);
  }
  return fmt::format("{} {}", v, units[u]);
}

}  // namespace tprun
