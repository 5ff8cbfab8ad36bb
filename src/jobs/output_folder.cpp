#include "jobs/output_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/tensor_file.h"
#include "jobs/manifest.h"
#include "jobs/mp4_file.h"
#include "memory/memory_options.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

fs::path real_path(const std::string& p) {
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  fs::path r = fs::weakly_canonical(abs, ec);
  r = (ec ? abs : r).lexically_normal();
  return r.has_filename() || r == r.root_path() ? r : r.parent_path();
}

bool path_within(const fs::path& child, const fs::path& parent) {
  auto ci = child.begin();
  for (auto pi = parent.begin(); pi != parent.end(); ++pi, ++ci) {
    if (pi->empty()) continue;  // a trailing separator
    if (ci == child.end() || *ci != *pi) return false;
  }
  return true;
}

namespace {

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
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

namespace {

// Opens the lock file without following a symlink (a symlink planted as
// .tprun.lock would otherwise have its target truncated) and checks that what
// was opened is a regular file. Returns -1 with errno ENOENT only when
// `flags` lacks O_CREAT and the file does not exist.
int open_lock_file(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT && !(flags & O_CREAT)) return -1;
    if (err == ELOOP) {
      throw ConfigError(fmt::format("lock file {} is a symbolic link; tprun does not follow it (it would overwrite "
                                    "the link's target): remove it",
                                    path));
    }
    struct stat lst {};
    if (::lstat(path.c_str(), &lst) == 0 && !S_ISREG(lst.st_mode)) {  // a folder (EISDIR), a socket (ENXIO), ...
      throw ConfigError(fmt::format("lock file {} is not a regular file; remove it", path));
    }
    throw_io_error((flags & O_CREAT) ? "cannot create the lock file" : "cannot open the lock file", path, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(fmt::format("lock file {} is not a regular file; remove it", path));
  }
  return fd;
}

// flock with EINTR retried; returns 0 or the errno value.
int flock_nb(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

[[noreturn]] void throw_in_use(const std::string& dir, int fd, const std::string& lock_path) {
  const std::string holder = holder_of(fd);
  ::close(fd);
  throw ConfigError(fmt::format("output folder {} in use by {} (lock {}); one run per output folder: wait for "
                                "it to end, or pick another --out",
                                dir, holder, lock_path));
}

// flock(op) on `fd`: true with `held` = fd when taken; false (fd closed, `unsupported` set) where the
// file system has no locks; ConfigError when a run holds the folder, IoError on any other failure.
bool take_lock(int fd, int op, const std::string& dir, const std::string& path, int& held, std::string& unsupported) {
  const int err = flock_nb(fd, op);
  if (err == 0) {
    held = fd;
    return true;
  }
  if (err == EWOULDBLOCK) throw_in_use(dir, fd, path);
  ::close(fd);
  if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK || err == EINVAL) {
    unsupported = std::strerror(err);
    return false;
  }
  throw_io_error("cannot lock", path, err);
}

}  // namespace

std::unique_ptr<OutputLock> OutputLock::acquire(const std::string& dir) {
  std::unique_ptr<OutputLock> lock(new OutputLock());
  lock->path_ = (fs::path(dir) / kLockFileName).string();
  const int fd = open_lock_file(lock->path_, O_RDWR | O_CREAT);
  if (!take_lock(fd, LOCK_EX, dir, lock->path_, lock->fd_, lock->unsupported_)) return lock;
  const std::string me = fmt::format("pid {} host {}\n", ::getpid(), host_name());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    throw_io_error("cannot write", lock->path_, errno);
  }
  return lock;
}

std::unique_ptr<OutputLock> OutputLock::acquire_shared(const std::string& dir) {
  std::unique_ptr<OutputLock> lock(new OutputLock());
  lock->path_ = (fs::path(dir) / kLockFileName).string();
  const int fd = open_lock_file(lock->path_, O_RDONLY);
  if (fd < 0) return lock;  // no run ever locked this folder: nothing to wait for, nothing created
  take_lock(fd, LOCK_SH, dir, lock->path_, lock->fd_, lock->unsupported_);
  return lock;
}

OutputLock::~OutputLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

std::string check_output_placement(const Manifest& m) {
  const fs::path out(m.output_dir);
  if (path_within(real_path(m.output_dir), real_path(m.model))) {
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
    if (name == "results.jsonl" || name == kLockFileName || name == "images" || name == "videos" || name == "store" ||
        name == "embeddings") {
      ours = true;  // embeddings/: a staged run's prompt cache (a rerun may find only that)
    }
    if (name == "logs") continue;  // per-rank logs (--log-dir OUT/logs) are made before the job starts
    if (example.empty()) example = name;
    ++entries;
  }
  if (entries == 0 || ours) return "";
  return fmt::format("OUTPUT FOLDER {} IS NOT EMPTY and holds no tprun results ({} entries, e.g. '{}'): tprun adds "
                     "results.jsonl, images/, videos/, store/ and embeddings/ next to them. Is this the folder you meant? (--out DIR)",
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

// ---- every path tprun writes -------------------------------------------------

namespace tprun::jobs {
namespace {

using FileId = std::pair<dev_t, ino_t>;

std::optional<FileId> file_id(const fs::path& p, bool follow = true) {
  struct stat st {};
  if ((follow ? ::stat(p.c_str(), &st) : ::lstat(p.c_str(), &st)) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// Every regular file below `dir` (symlinks to files followed, to folders not:
// a link loop cannot stall the walk), at most `limit` entries: a model folder
// holds tens of files.
void collect_file_ids(const fs::path& dir, std::map<FileId, std::string>& ids, size_t limit = 200000) {
  std::error_code ec;
  size_t seen = 0;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end && seen < limit; it.increment(ec), ++seen) {
    struct stat st {};
    if (::stat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      ids.emplace(FileId{st.st_dev, st.st_ino}, it->path().string());
    }
  }
}

std::string read_head(const fs::path& p, size_t max_bytes) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) return {};
  std::string out(max_bytes, '\0');
  out.resize(std::fread(out.data(), 1, max_bytes, f));
  std::fclose(f);
  return out;
}

// Why the PNG at `p` is not one tprun wrote ("" when it is): a PNG whose
// "Software" text chunk (whole, its CRC checked) says "tprun <version>", as
// tprun's writer puts it before the image data, so one damaged since (a
// flipped or cut IDAT: resume runs it again) still counts; and an empty file
// (nothing in it to lose; tprun's atomic writes never leave one).
std::string png_not_ours(const fs::path& p) {
  std::string software;
  const std::string bad = pipelines::png_incomplete(p.string(), &software);
  if (software.rfind("tprun ", 0) == 0) return "";
  std::error_code ec;
  if (fs::is_regular_file(p, ec) && fs::file_size(p, ec) == 0 && !ec) return "";
  if (!bad.empty()) return fmt::format("not a complete PNG ({})", bad);
  return "a PNG without tprun's Software text chunk";
}

// As png_not_ours: an MP4 whose comment tag says "tprun <version>" (read
// from moov, which tprun's writer puts before the media data, so one cut
// short since still counts and resume writes it again), or an empty file.
std::string mp4_not_ours(const fs::path& p) {
  Mp4Facts facts;
  const std::string bad = mp4_incomplete(p.string(), &facts);
  if (facts.comment.rfind("tprun ", 0) == 0) return "";
  std::error_code ec;
  if (fs::is_regular_file(p, ec) && fs::file_size(p, ec) == 0 && !ec) return "";
  if (!bad.empty()) return fmt::format("not a complete MP4: {}", bad);
  return "an MP4 without tprun's comment tag";
}

std::string tensors_not_ours(const fs::path& p) {
  try {
    const auto h = checkpoint::read_safetensors_header(p.string());
    auto it = h.metadata.find(checkpoint::kTensorFileWriterKey);
    if (it != h.metadata.end() && it->second == checkpoint::kTensorFileWriter) return "";
    return "a safetensors file without tprun's writer metadata";
  } catch (const Error&) {
    return "not a safetensors file";
  }
}

std::string status_not_ours(const fs::path& p) {
  std::error_code ec;
  if (fs::file_size(p, ec) > 65536 || ec) return "not a tprun status (too large)";
  try {
    const auto j = nlohmann::json::parse(read_head(p, 65536));
    if (j.is_object() && j.contains("exit_code") && j["exit_code"].is_number_integer() && j.contains("state") &&
        j["state"].is_string()) {
      return "";
    }
  } catch (const std::exception&) {
  }
  return "not a tprun status ({\"exit_code\": N, \"state\": ...})";
}

const char* kind_name(OutputKind kind) {
  switch (kind) {
    case OutputKind::Png: return "PNG";
    case OutputKind::Tensors: return "tensors file";
    case OutputKind::Status: return "status file";
    case OutputKind::Folder: return "folder";
    case OutputKind::Forced: return "file";
    case OutputKind::Mp4: return "MP4";
  }
  return "file";
}

[[noreturn]] void refuse(const std::string& option, const std::string& path, const std::string& why) {
  throw ConfigError(fmt::format("{} {}: {}", option, clip_text(path, 400), why), true);
}

}  // namespace

void check_output_path(const std::string& path, const std::string& option, const std::vector<ReadPath>& reads,
                       OutputKind kind) {
  if (path.empty()) refuse(option, "''", "names no path");
  const fs::path target = real_path(path);
  // 1. Not inside a folder the command reads (by path, and by device+inode of
  //    every folder above the target, for bind mounts and other aliases), not
  //    a file it reads (by path).
  std::map<FileId, std::string> read_ids;
  std::map<FileId, const ReadPath*> read_dirs;
  for (const ReadPath& r : reads) {
    if (r.path.empty()) continue;
    const fs::path real = real_path(r.path);
    std::error_code ec;
    if (fs::is_directory(real, ec)) {
      if (path_within(target, real)) {
        const fs::path plain = fs::absolute(path, ec).lexically_normal();
        refuse(option, path,
               fmt::format("is inside {} {}{}; tprun never writes there: pick a path outside it", r.what, r.path,
                           plain == target ? std::string() : fmt::format(" (it resolves to {})", target.string())));
      }
      if (auto id = file_id(real)) read_dirs.emplace(*id, &r);
      collect_file_ids(real, read_ids);
    } else {
      if (target == real) refuse(option, path, fmt::format("is {} {}, which this run reads: pick another path", r.what, r.path));
      if (auto id = file_id(real)) read_ids.emplace(*id, r.path);
    }
  }
  for (fs::path dir = target; !dir.empty(); dir = dir.parent_path()) {
    if (auto id = file_id(dir)) {
      if (auto it = read_dirs.find(*id); it != read_dirs.end()) {
        refuse(option, path,
               fmt::format("is inside {} {} (reached through {}); tprun never writes there: pick a path outside it",
                           it->second->what, it->second->path, dir.string()));
      }
    }
    if (dir == dir.root_path()) break;
  }
  // 2. What is there now.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (auto it = read_ids.find(FileId{st.st_dev, st.st_ino}); it != read_ids.end()) {
      struct stat lst {};
      const bool link = ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
      refuse(option, path, fmt::format("is the same file as {} (a {}), which this run reads: pick another path",
                                       it->second, link ? "symbolic link" : "hard link"));
    }
  }
  const std::string why = foreign_output(path, kind);
  if (why.empty()) return;
  if (why.rfind("exists and is not a", 0) == 0 && kind != OutputKind::Folder) {
    refuse(option, path, why + "; tprun replaces only its own outputs: remove it or pick another path");
  }
  if (why.find("leads nowhere") != std::string::npos) {
    refuse(option, path, why + "; tprun writes only a new file or one it wrote: remove it");
  }
  refuse(option, path, why);
}

std::string foreign_output(const std::string& path, OutputKind kind) {
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "";  // nothing there (a missing folder is check_output_file's)
    return fmt::format("cannot be inspected: {}", std::strerror(errno));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return fmt::format("is a symbolic link that leads nowhere ({})", std::strerror(errno));
  }
  if (kind == OutputKind::Folder) return S_ISDIR(st.st_mode) ? "" : "exists and is not a folder";
  if (S_ISDIR(st.st_mode)) return "is a folder, not a file name";
  if (!S_ISREG(st.st_mode)) return "exists and is not a regular file";
  if (kind == OutputKind::Forced) return "";
  const std::string why = kind == OutputKind::Png       ? png_not_ours(path)
                          : kind == OutputKind::Mp4     ? mp4_not_ours(path)
                          : kind == OutputKind::Tensors ? tensors_not_ours(path)
                                                        : status_not_ours(path);
  return why.empty() ? "" : fmt::format("exists and is not {} {} tprun wrote ({})", kind == OutputKind::Mp4 ? "an" : "a",
                                         kind_name(kind), why);
}

std::vector<ReadPath> job_inputs(const Manifest& m) {
  std::vector<ReadPath> reads = {{"the manifest", m.path}, {"the model folder", m.model}, {"the requests file", m.requests}};
  if (m.defaults.loras) {
    for (const auto& c : *m.defaults.loras) reads.push_back({"a LoRA adapter ([[loras]])", c.path});
  }
  return reads;
}

void check_status_file(const std::string& status_file, const std::string& manifest,
                       const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<ReadPath> reads = {{"the manifest", manifest}};
  std::optional<Manifest> m;
  try {
    m = parse_manifest(manifest, overrides);
  } catch (const Error&) {
    // The run reports the manifest's own errors (and writes this status file).
  }
  if (m) reads = job_inputs(*m);
  check_output_path(status_file, "--status-file", reads, OutputKind::Status);
  if (m) {
    // The job's own files in its output folder (a shard's too): the status is
    // written last, atomically, and would replace them.
    const fs::path target = real_path(status_file);
    const std::string name = target.filename().string();
    if ((name == "results.jsonl" || name == kLockFileName) && path_within(target, real_path(m->output_dir))) {
      refuse("--status-file", status_file,
             fmt::format("is the job's own {} in its output folder {}: pick another path", name, m->output_dir));
    }
  }
}

void check_offload_folders(const memory::MemoryOptions& mo, const std::string& where,
                           const std::vector<ReadPath>& reads) {
  // "--memory offload.disk_path" on the command line, "<manifest>: memory.offload.disk_path" in a manifest.
  const std::string prefix = where.rfind("--", 0) == 0 ? where + " " : where + ": memory.";
  if (!mo.offload.disk_path.empty()) {
    check_output_path(mo.offload.disk_path, prefix + "offload.disk_path", reads, OutputKind::Folder);
  }
  if (!mo.offload_folder.empty()) {
    check_output_path(mo.offload_folder, prefix + "offload_folder", reads, OutputKind::Folder);
  }
}

}  // namespace tprun::jobs
