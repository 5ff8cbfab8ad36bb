#pragma once
// One error hierarchy for all of tprun. Every exception that tprun throws on
// purpose derives from tprun::Error; messages name the file, field, tensor or
// numbers involved and say what to do.

#include <stdexcept>
#include <string>

namespace tprun {

class Error : public std::runtime_error {
 public:
  enum class Kind { Config, Checkpoint, Comm, Request, Io, Device, Internal };

  // `all_ranks`: every rank of the job detects this same error at the same
  // point (it was computed from values every rank shares, or rank 0 decided and
  // broadcast it). The process boundary then exits cleanly on every rank with
  // the message instead of tearing the job down with MPI_Abort.
  Error(Kind kind, const std::string& message, bool all_ranks = false);

  Kind kind() const noexcept { return kind_; }
  bool all_ranks() const noexcept { return all_ranks_; }
  // "config error", "checkpoint error", ...
  const char* kind_name() const noexcept;
  // Process exit code for this kind (README "Exit codes"; docs/jobs.md).
  int exit_code() const noexcept;

 private:
  Kind kind_;
  bool all_ranks_;
};

// A manifest, CLI value, environment variable or mesh layout is wrong.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& m, bool all_ranks = false)
      : Error(Kind::Config, m, all_ranks) {}
};

// A checkpoint file or folder is malformed or does not match the model.
class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& m, bool all_ranks = false)
      : Error(Kind::Checkpoint, m, all_ranks) {}
};

// A collective failed, timed out or was misused.
class CommError : public Error {
 public:
  explicit CommError(const std::string& m, bool all_ranks = false)
      : Error(Kind::Comm, m, all_ranks) {}
};

// One generation request is bad; the batch goes on without it.
class RequestError : public Error {
 public:
  explicit RequestError(const std::string& m, bool all_ranks = false)
      : Error(Kind::Request, m, all_ranks) {}
};

// Writing or reading an output failed in the operating system (disk full,
// read-only file system, quota, permissions): the message names the path and
// the errno text ("No space left on device").
class IoError : public Error {
 public:
  explicit IoError(const std::string& m, bool all_ranks = false) : Error(Kind::Io, m, all_ranks) {}
};

// A call into the accelerator's runtime failed (a CUDA error other than a
// request running out of memory, which is a RequestError): the message names
// the source file, line and call (runtime/cuda_check.h).
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& m, bool all_ranks = false) : Error(Kind::Device, m, all_ranks) {}
};

// "<what>: <path>: <strerror(err)>" as an IoError (err: an errno value).
[[noreturn]] void throw_io_error(const std::string& what, const std::string& path, int err);

// `text` for a message: whole when at most `keep` characters, else its first
// `keep` characters + "…(N chars)", so a hostile value never floods a log.
std::string clip_text(const std::string& text, size_t keep = 64);

// Rethrows `e` as the same kind, marked as raised identically on every rank
// (for file tools whose every rank checks the same input).
[[noreturn]] void rethrow_on_all_ranks(const Error& e);

// Exit codes of the tprun process.
namespace exit_code {
constexpr int kOk = 0;
constexpr int kInternal = 1;
constexpr int kUsage = 2;
constexpr int kConfig = 3;
constexpr int kCheckpoint = 4;
constexpr int kComm = 5;
constexpr int kRequest = 6;
constexpr int kIo = 7;
constexpr int kDevice = 8;
}  // namespace exit_code

}  // namespace tprun
