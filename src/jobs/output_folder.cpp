#include "jobs/output_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "jobs/manifest.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// `child` is `parent` or lies below it (both made absolute, symlinks resolved
// where they exist).
bool is_within(const fs::path& child, const fs::path& parent) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(fs::absolute(child), ec);
  const fs::path p = fs::weakly_canonical(fs::absolute(parent), ec);
  if (c.empty() || p.empty()) return false;
  auto ci = c.begin();
  for (auto pi = p.begin(); pi != p.end(); ++pi, ++ci) {
    if (pi->empty()) continue;  // a trailing separator
    if (ci == c.end() || *ci != *pi) return false;
  }
  return true;
}

std::string holder_of(int fd) {
  char buf[512] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  unsigned long pid = 0;
  char host[256] = {0};
  if (std::sscanf(text.c_str(), "pid %lu host %255s", &pid, host) == 2) return fmt::format("pid {} on {}", pid, host);
  return "another process (it has not written its pid yet)";
}

}  // namespace

std::unique_ptr<OutputLock> OutputLock::acquire(const std::string& dir) {
  std::unique_ptr<OutputLock> lock(new OutputLock());
  lock->path_ = (fs::path(dir) / kLockFileName).string();
  const int fd = ::open(lock->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw_io_error("cannot create the lock file", lock->path_, errno);
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = holder_of(fd);
      ::close(fd);
      throw ConfigError(fmt::format("output folder {} in use by {} (lock {}); one run per output folder: wait for "
                                    "it to end, or pick another --out",
                                    dir, holder, lock->path_));
    }
    ::close(fd);
    if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK || err == EINVAL) {
      lock->unsupported_ = std::strerror(err);
      return lock;
    }
    throw_io_error("cannot lock", lock->path_, err);
  }
  lock->fd_ = fd;
  const std::string me = fmt::format("pid {} host {}\n", ::getpid(), host_name());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    throw_io_error("cannot write", lock->path_, errno);
  }
  return lock;
}

OutputLock::~OutputLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

std::string check_output_placement(const Manifest& m) {
  const fs::path out(m.output_dir);
  if (is_within(out, m.model)) {
    throw ConfigError(fmt::format("{}: output.dir: {} is inside the model folder {}; write the outputs elsewhere "
                                  "(--out DIR)",
                                  m.path, m.output_dir, m.model),
                      true);
  }
  std::error_code ec;
  const auto st = fs::status(out, ec);
  if (!fs::exists(st)) return "";
  if (!fs::is_directory(st)) {
    throw ConfigError(fmt::format("{}: output.dir: {} exists and is not a folder", m.path, m.output_dir), true);
  }
  int64_t entries = 0;
  std::string example;
  bool ours = false;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "results.jsonl" || name == kLockFileName || name == "images" || name == "store") ours = true;
    if (name == "logs") continue;  // per-rank logs (--log-dir OUT/logs) are made before the job starts
    if (example.empty()) example = name;
    ++entries;
  }
  if (entries == 0 || ours) return "";
  return fmt::format("OUTPUT FOLDER {} IS NOT EMPTY and holds no tprun results ({} entries, e.g. '{}'): tprun adds "
                     "results.jsonl, images/ and store/ next to them. Is this the folder you meant? (--out DIR)",
                     m.output_dir, entries, clip_text(example));
}

void check_output_file(const std::string& path, const std::string& option) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw ConfigError(fmt::format("{} {}: is a folder, not a file name", option, path), true);
  if (!fs::exists(dir, ec)) {
    throw ConfigError(fmt::format("{} {}: the folder {} does not exist", option, path, dir.string()), true);
  }
  if (!fs::is_directory(dir, ec)) {
    throw ConfigError(fmt::format("{} {}: {} is not a folder", option, path, dir.string()), true);
  }
  std::string probe = (dir / ("." + p.filename().string() + ".tmp-probe-XXXXXX")).string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) throw_io_error(option + " is not writable: cannot create a file in", dir.string(), errno);
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0 && (::geteuid() == 0 ? vfs.f_bfree : vfs.f_bavail) == 0) {
    throw_io_error(option + " cannot be written", dir.string(), ENOSPC);
  }
}

}  // namespace tprun::jobs
