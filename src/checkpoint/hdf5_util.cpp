#include "checkpoint/hdf5_util.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::checkpoint {

void h5_silence_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

int h5_write_errno(const std::string& path, uint64_t offset, uint64_t size) {
  if (size == 0) size = 1;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    // Not created: could a file be created in its folder?
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const int tmp = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    if (tmp < 0) return errno == EOPNOTSUPP || errno == EISDIR ? 0 : errno;
    ::close(tmp);
    return 0;
  }
  if (fd < 0) return errno;
  int err = 0;
  if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(size)) != 0 &&
      errno != EOPNOTSUPP && errno != ENOSYS) {
    err = errno;
  }
  ::close(fd);
  if (err != 0) return err;
  struct rlimit fsize {};
  if (::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY && offset + size > fsize.rlim_cur) {
    return EFBIG;
  }
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) == 0 && static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < size) return ENOSPC;
  return 0;
}

std::string h5_error_text() {
  struct Walk {
    std::string first, last;
  } w;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        if (e->desc != nullptr && *e->desc != '\0') {
          if (w->first.empty()) w->first = e->desc;
          w->last = e->desc;
        }
        return 0;
      },
      &w);
  H5Eclear2(H5E_DEFAULT);
  if (w.first.empty()) return "HDF5 error";
  return w.first == w.last ? w.first : fmt::format("{} ({})", w.first, w.last);
}

hid_t check_id(hid_t id, const std::string& where, const std::string& what) {
  if (id < 0) throw CheckpointError(fmt::format("{}: {} failed: {}", where, what, h5_error_text()));
  return id;
}

void check_rc(herr_t rc, const std::string& where, const std::string& what) {
  if (rc < 0) throw CheckpointError(fmt::format("{}: {} failed: {}", where, what, h5_error_text()));
}

}  // namespace tprun::checkpoint
