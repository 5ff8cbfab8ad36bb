// What tprun makes inside an output folder: folders and files never reached
// through a symlink, temporaries that never follow one, and the placement of
// a finished file that never replaces a file tprun did not write. See
// output_folder.h.
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "jobs/output_folder.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

std::string link_target(const fs::path& p) {
  std::error_code ec;
  const fs::path t = fs::read_symlink(p, ec);
  return ec ? std::string("?") : clip_text(t.string(), 300);
}

[[noreturn]] void refuse_entry(const fs::path& p, const std::string& what) {
  throw ConfigError(fmt::format("{} {}; tprun does not follow or replace it inside an output folder (its files would "
                                "land elsewhere): remove it, or choose another output folder",
                                clip_text(p.string(), 400), what));
}

}  // namespace

void check_output_entry(const fs::path& dir, const std::string& name, EntryKind kind) {
  const fs::path p = dir / name;
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw_io_error("cannot inspect", p.string(), errno);
  }
  if (S_ISLNK(st.st_mode)) refuse_entry(p, fmt::format("is a symbolic link (to {})", link_target(p)));
  if (kind == EntryKind::Folder && !S_ISDIR(st.st_mode)) refuse_entry(p, "exists and is not a folder");
  if (kind == EntryKind::File && !S_ISREG(st.st_mode)) refuse_entry(p, "exists and is not a regular file");
}

fs::path make_output_folder(const fs::path& dir, const std::string& name) {
  const fs::path p = dir / name;
  if (::mkdir(p.c_str(), 0777) != 0 && errno != EEXIST) throw_io_error("cannot create the folder", p.string(), errno);
  check_output_entry(dir, name, EntryKind::Folder);  // EEXIST: whatever was there (a symlink is not followed)
  return p;
}

fs::path make_output_folders(const fs::path& dir, const std::string& rel) {
  fs::path at = dir;
  const fs::path folder = fs::path(rel).parent_path();
  for (const auto& part : folder) {
    if (part.empty() || part == ".") continue;
    at = make_output_folder(at, part.string());
  }
  return at;
}

bool is_output_temp(const std::string& name) {
  // ".<name>.tmp" (the HDF5 store) or ".<name>.tmp-<letters and digits>"
  // (mkstemp's six, a pid, "merge-<pid>"); write_png's own temporary of one
  // of these is ".<that name>.tmp-XXXXXX".
  if (name.size() < 6 || name[0] != '.') return false;
  if (name.size() > 5 && name.compare(name.size() - 4, 4, ".tmp") == 0) return true;
  const size_t at = name.rfind(".tmp-");
  if (at == std::string::npos || at == 0 || at + 5 == name.size()) return false;
  for (size_t i = at + 5; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

OutputTemp::OutputTemp(const std::string& path) : target_(path) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  tmp_ = (dir / ("." + p.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkstemp(tmp_.data());  // O_CREAT | O_EXCL: never an existing file, never through a symlink
  if (fd < 0) throw_io_error(fmt::format("cannot create a temporary file in {} for", dir.string()), path, errno);
  ::close(fd);
}

OutputTemp::~OutputTemp() {
  if (!placed_) ::unlink(tmp_.c_str());
}

void OutputTemp::place(OutputKind kind) {
  placed_ = true;  // place_output_file removes the temporary in every case
  place_output_file(tmp_, target_, kind);
}

namespace {

[[noreturn]] void refuse_foreign(const std::string& path, const std::string& why) {
  throw ConfigError(fmt::format("{} {}; tprun never replaces a file it did not write: move it away, or choose another "
                                "output path",
                                clip_text(path, 400), why));
}

// 0, or the errno of a failed renameat2 (EINVAL / ENOSYS: the flag is not supported here).
int rename_flags(const std::string& from, const std::string& to, unsigned flags) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) == 0 ? 0 : errno;
}

// `tmp` at `path` only if nothing is there: true when placed, false when a file is there.
bool place_new(const std::string& tmp, const std::string& path) {
  int err = rename_no_replace(tmp, path);
  if (err == 0) return true;
  if (err == EEXIST) return false;
  if (err == EPERM || err == EOPNOTSUPP || err == EMLINK) {  // no hard links either: checked, then renamed
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) return false;
    if (::rename(tmp.c_str(), path.c_str()) == 0) return true;
    err = errno;
  }
  ::unlink(tmp.c_str());
  throw_io_error(fmt::format("cannot rename {} to", tmp), path, err);
}

}  // namespace

int rename_no_replace(const std::string& from, const std::string& to) {
  int err = rename_flags(from, to, RENAME_NOREPLACE);
  if (err == EINVAL || err == ENOSYS) {  // no RENAME_NOREPLACE on this file system: link(2) refuses an existing name too
    if (::link(from.c_str(), to.c_str()) == 0) {
      ::unlink(from.c_str());
      return 0;
    }
    err = errno;
  }
  return err;
}

void place_output_file(const std::string& tmp, const std::string& path, OutputKind kind) {
  if (place_new(tmp, path)) return;
  // Something is there: replaced only when tprun wrote it.
  std::string why = foreign_output(path, kind);
  if (!why.empty()) {
    ::unlink(tmp.c_str());
    refuse_foreign(path, why);
  }
  int err = rename_flags(tmp, path, RENAME_EXCHANGE);
  if (err == EINVAL || err == ENOSYS) {
    // No RENAME_EXCHANGE here (NFS, some FUSE): the check above and this rename are a few microseconds apart.
    if (::rename(tmp.c_str(), path.c_str()) == 0) return;
    err = errno;
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw_io_error(fmt::format("cannot rename {} to", tmp), path, err);
  }
  // `tmp` now holds what was displaced: it must be what was checked (one of tprun's).
  why = foreign_output(tmp, kind);
  if (why.empty()) {
    ::unlink(tmp.c_str());
    return;
  }
  if (rename_flags(tmp, path, RENAME_EXCHANGE) == 0) {
    ::unlink(tmp.c_str());  // the new output, swapped back out
    refuse_foreign(path, why);
  }
  throw IoError(fmt::format("{} appeared at {} while tprun replaced its own file there, and could not be put back: "
                            "it is now at {}",
                            why, clip_text(path, 400), tmp));
}

void place_new_file(const std::string& tmp, const std::string& path) {
  if (place_new(tmp, path)) return;
  ::unlink(tmp.c_str());
  refuse_foreign(path, "exists");
}

std::string png_frames_problem(int64_t frames) {
  if (frames == 1) return "";
  return fmt::format("a PNG holds one image, and the result has {} frames (tprun never writes one frame of them "
                     "alone): write it as a video (mp4), a folder of PNG frames (frames) or into HDF5",
                     frames);
}

void write_png_output(const std::string& path, const uint8_t* rgb, int width, int height, int64_t frames,
                      const std::vector<std::pair<std::string, std::string>>& text) {
  if (const std::string why = png_frames_problem(frames); !why.empty()) {
    throw RequestError(fmt::format("cannot write {}: {}", path, why), true);
  }
  OutputTemp tmp(path);
  pipelines::write_png(tmp.path(), rgb, width, height, text);  // its own temporary, renamed onto ours
  tmp.place(OutputKind::Png);
}

}  // namespace tprun::jobs
