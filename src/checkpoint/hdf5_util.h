#pragma once
// Small shared pieces of tprun's HDF5 code: an owning identifier handle and
// error checks that turn HDF5's error stack into one CheckpointError line.

#include <cstdint>
#include <string>

#include <hdf5.h>

namespace tprun::checkpoint {

// One HDF5 identifier, closed with its close function.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = -1;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  // Closes now and reports whether that worked.
  bool close() {
    const bool ok = id_ < 0 || closer_(id_) >= 0;
    id_ = -1;
    return ok;
  }

 private:
  void reset() {
    if (id_ >= 0) closer_(id_);
    id_ = -1;
  }
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Turns off HDF5's automatic printing of its error stack to stderr (once per process): tprun
// reports each failure itself, as one line.
void h5_silence_errors();

// Why a write of `size` bytes at `offset` into the file at `path` that HDF5 reported as failed
// could not be done, as an errno value (0: none found). HDF5 (above all through MPI-IO) loses the
// operating system's errno, so this asks the file system again: the file opened for writing, the
// range reserved (fallocate, KEEP_SIZE: no data changes), RLIMIT_FSIZE, the free space.
int h5_write_errno(const std::string& path, uint64_t offset, uint64_t size);

// The HDF5 error stack as one line ("unable to open file (file signature not found)"), cleared.
std::string h5_error_text();
// CheckpointError "<where>: <what> failed: <HDF5 error>" for a negative id / return code.
hid_t check_id(hid_t id, const std::string& where, const std::string& what);
void check_rc(herr_t rc, const std::string& where, const std::string& what);

}  // namespace tprun::checkpoint
