#include "runtime/logging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
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

namespace fs = std::filesystem;

// Appends each formatted line to an open descriptor (O_APPEND: one write(2)
// per line, so the lines of a rank's log stay whole).
class AppendSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit AppendSink(int fd) : fd_(fd) {}
  ~AppendSink() override { ::close(fd_); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    const char* p = line.data();
    size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // a full disk loses log lines, never the run
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  void flush_() override {}

 private:
  int fd_;
};

[[noreturn]] void refuse_log(const std::string& dir, const std::string& what) {
  throw ConfigError(fmt::format("--log-dir {}: {}", dir, what));
}

// The log folder is no model folder and lies in none: neither it nor a folder
// above it holds model_index.json (a pipeline), and it holds no config.json,
// tokenizer file or diffusers/transformers weights file (a component or
// tokenizer folder, as `forward`, `bench` and `inspect` read them). Symlinks
// are resolved first.
void check_log_folder(const std::string& dir) {
  std::error_code ec;
  const fs::path abs = fs::absolute(dir, ec);
  fs::path real = fs::weakly_canonical(abs, ec);
  if (ec) real = abs;
  real = real.lexically_normal();
  if (!real.has_filename()) real = real.parent_path();
  for (fs::path p = real; !p.empty(); p = p.parent_path()) {
    if (fs::exists(p / "model_index.json", ec)) {
      refuse_log(dir, fmt::format("{} the model folder {} (it holds model_index.json); tprun never writes into a "
                                  "model folder: choose another --log-dir (or --log-dir '' for no log files)",
                                  p == real ? "is" : "is inside", p.string()));
    }
    if (p == p.root_path()) break;
  }
  // Named files, not a listing: every rank checks, and a log folder may hold thousands of logs.
  for (const char* n : {"config.json", "tokenizer.json", "tokenizer_config.json", "diffusion_pytorch_model.safetensors",
                        "model.safetensors", "diffusion_pytorch_model.safetensors.index.json",
                        "model.safetensors.index.json"}) {
    if (fs::exists(real / n, ec)) {
      refuse_log(dir, fmt::format("{} holds {}: it is a model folder (a component's or a tokenizer's); tprun never "
                                  "writes into a model folder: choose another --log-dir (or --log-dir '' for no log "
                                  "files)",
                                  real.string(), n));
    }
  }
}

// Whether `head` starts as tprun's log lines do: "[YYYY-MM-DD HH:MM:SS.mmm] [r".
bool tprun_log_head(const std::string& head) {
  static const char kShape[] = "[dddd-dd-dd dd:dd:dd.ddd] [r";
  const size_t n = sizeof kShape - 1;
  if (head.size() < n) return false;
  for (size_t i = 0; i < n; ++i) {
    const char want = kShape[i], got = head[i];
    if (want == 'd' ? (got < '0' || got > '9') : got != want) return false;
  }
  return true;
}

// This rank's log, opened for appending without following a symlink (a
// planted rank-NNNN.log symlink would get the log appended to its target): a
// new file, an empty one, or one tprun wrote (its first line one of tprun's
// log lines: reruns append to their own logs). What is checked is what the
// descriptor appends to, so nothing can be swapped in between.
int open_rank_log(const std::string& dir, const fs::path& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    struct stat lst {};
    const bool there = ::lstat(path.c_str(), &lst) == 0;
    if (err == ELOOP || (there && S_ISLNK(lst.st_mode))) {
      std::error_code ec;
      refuse_log(dir, fmt::format("{} is a symbolic link (to {}); tprun does not follow it (the log would be appended "
                                  "to the link's target): remove it, or choose another --log-dir",
                                  path.string(), fs::read_symlink(path, ec).string()));
    }
    if (there && !S_ISREG(lst.st_mode)) {
      refuse_log(dir, fmt::format("{} is not a regular file: remove it, or choose another --log-dir", path.string()));
    }
    throw ConfigError(fmt::format("cannot open log file '{}': {}", path.string(), std::strerror(err)));
  }
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "is not a regular file: remove it, or choose another --log-dir";
  } else if (st.st_size > 0) {
    std::string head(32, '\0');
    const ssize_t n = ::pread(fd, head.data(), head.size(), 0);
    head.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (!tprun_log_head(head)) {
      why = "exists and is not a log tprun wrote (its first line is not a tprun log line); tprun appends only to "
            "its own logs: move it away, or choose another --log-dir";
    }
  }
  if (why.empty() && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) why = std::strerror(errno);
  if (!why.empty()) {
    ::close(fd);
    refuse_log(dir, fmt::format("{} {}", path.string(), why));
  }
  return fd;
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
    check_log_folder(o.dir);
    std::error_code ec;
    fs::create_directories(o.dir, ec);
    if (ec) {
      throw ConfigError(fmt::format("cannot create log directory '{}' (--log-dir): {}", o.dir,
                                    ec.message()));
    }
    const fs::path path = fs::path(o.dir) / fmt::format("rank-{:04d}.log", o.rank);
    auto file = std::make_shared<AppendSink>(open_rank_log(o.dir, path));
    file->set_level(file_level);
    file->set_pattern(pattern);
    sinks.push_back(file);
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
