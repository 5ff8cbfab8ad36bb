#pragma once
// Where a job's outputs go, and who may write there.
//
// OutputLock: one run per output folder. The writer (world rank 0 of
// `tprun run`) takes an exclusive flock(2) on <dir>/.tprun.lock for the whole
// run and writes "pid N host H" into it; the kernel releases the lock when the
// process ends in any way, so a killed run never leaves a stale lock (the file
// stays; its content is only informative). On NFS, Linux emulates flock with
// whole-file POSIX locks, which other clients see (NFSv4, or v3 with lockd)
// unless the mount uses local_lock=flock|all; on Lustre flock is cluster-wide
// only with the `flock` mount option (`localflock`: this node only;
// `noflock`: refused, and the run goes on unlocked with a warning).

#include <memory>
#include <string>

namespace tprun::jobs {

struct Manifest;

class OutputLock {
 public:
  // Takes the lock on `dir` (which must exist). ConfigError "output folder
  // <dir> in use by pid N on HOST" when another process holds it; IoError
  // naming the lock file when it cannot be created. Where the file system has
  // no locks, returns a lock that holds nothing and sets `unsupported`.
  static std::unique_ptr<OutputLock> acquire(const std::string& dir);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Why the file system refused locking ("" when held).
  const std::string& unsupported() const { return unsupported_; }

 private:
  OutputLock() = default;
  std::string path_, unsupported_;
  int fd_ = -1;
};

inline constexpr const char* kLockFileName = ".tprun.lock";

// Checks, without writing anything, that `m.output_dir` may hold a job's
// outputs: not the model folder nor inside it (ConfigError naming the
// manifest and output.dir), not a file. Returns a warning ("" if none) for a
// folder that is not empty (a `logs` folder aside) and holds no tprun results
// (results.jsonl, the lock file, images/, store/).
std::string check_output_placement(const Manifest& m);

// For a single output file (`generate --out`): its folder exists and is a
// folder (ConfigError naming `option`), the path is not a folder, and a file
// can be created there now (IoError naming the path and the errno text:
// read-only file system, permission, no space). Leaves nothing behind.
void check_output_file(const std::string& path, const std::string& option);

}  // namespace tprun::jobs
