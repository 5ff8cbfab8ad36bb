#include "runtime/logging.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"
#include "runtime/rank_env.h"

namespace tprun {
namespace {

bool known_level(const std::string& s) {
  return s == "trace" || s == "debug" || s == "info" || s == "warn" || s == "warning" ||
         s == "error" || s == "err" || s == "critical" || s == "off";
}

spdlog::level::level_enum to_level(const std::string& s) {
  if (s == "warning") return spdlog::level::warn;
  if (s == "error") return spdlog::level::err;
  return spdlog::level::from_str(s);
}

// SPDLOG_LEVEL may be "debug" or spdlog's "logger=level,..." form; the bare
// level (or the one for "tprun") applies.
std::string level_from_env() {
  const char* v = std::getenv("SPDLOG_LEVEL");
  if (v == nullptr) return "";
  std::string all(v);
  std::string found;
  size_t start = 0;
  while (start <= all.size()) {
    size_t comma = all.find(',', start);
    std::string item = all.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      if (known_level(item)) found = item;
    } else if (item.substr(0, eq) == "tprun" && known_level(item.substr(eq + 1))) {
      return item.substr(eq + 1);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return found;
}

}  // namespace

bool console_colour() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDERR_FILENO) == 1 && std::getenv("NO_COLOR") == nullptr && term != nullptr &&
         std::strcmp(term, "dumb") != 0;
}

void init_launch_logging() noexcept {
  try {
    LogOptions o;
    try {
      if (auto env = rank_env_from_variables(process_env())) {
        o.rank = env->rank;
        o.world = env->world;
      }
    } catch (const Error&) {
      // Inconsistent launcher variables are reported once the session starts.
    }
    o.level = level_from_env();
    init_logging(o);
  } catch (...) {
  }
}

void check_log_level(const std::string& level, const std::string& option) {
  if (!known_level(level)) {
    throw ConfigError(fmt::format(
        "{} '{}' is not a log level; use trace, debug, info, warn, error, critical or off", option,
        level));
  }
}

void init_logging(const LogOptions& o) {
  std::string level = o.level.empty() ? level_from_env() : o.level;
  if (level.empty()) level = "info";
  check_log_level(level, o.level.empty() ? "SPDLOG_LEVEL" : "--log-level");
  auto console_level = to_level(level);
  if (o.rank != 0 && console_level < spdlog::level::warn) console_level = spdlog::level::warn;

  const std::string pattern = fmt::format("[%Y-%m-%d %H:%M:%S.%e] [r{}/{}] [%^%l%$] %v", o.rank, o.world);
  std::vector<spdlog::sink_ptr> sinks;
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(
      console_colour() ? spdlog::color_mode::always : spdlog::color_mode::never);
  console->set_level(console_level);
  console->set_pattern(pattern);
  sinks.push_back(console);

  auto file_level = std::min(to_level(level), spdlog::level::debug);
  if (!o.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.dir, ec);
    if (ec) {
      throw ConfigError(fmt::format("cannot create log directory '{}' (--log-dir): {}", o.dir,
                                    ec.message()));
    }
    auto path = std::filesystem::path(o.dir) / fmt::format("rank-{:04d}.log", o.rank);
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path.string(), false);
      file->set_level(file_level);
      file->set_pattern(pattern);
      sinks.push_back(file);
    } catch (const spdlog::spdlog_ex& e) {
      throw ConfigError(fmt::format("cannot open log file '{}': {}", path.string(), e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>("tprun", sinks.begin(), sinks.end());
  logger->set_level(std::min(console_level, o.dir.empty() ? console_level : file_level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void flush_logs() noexcept {
  try {
    if (auto l = spdlog::default_logger()) l->flush();
  } catch (...) {
  }
}

}  // namespace tprun
