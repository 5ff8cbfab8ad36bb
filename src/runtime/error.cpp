#include "runtime/error.h"

#include <cstring>

namespace tprun {

Error::Error(Kind kind, const std::string& message, bool all_ranks)
    : std::runtime_error(message), kind_(kind), all_ranks_(all_ranks) {}

const char* Error::kind_name() const noexcept {
  switch (kind_) {
    case Kind::Config: return "config error";
    case Kind::Checkpoint: return "checkpoint error";
    case Kind::Comm: return "communication error";
    case Kind::Request: return "request error";
    case Kind::Io: return "I/O error";
    case Kind::Device: return "device error";
    case Kind::Internal: break;
  }
  return "internal error";
}

int Error::exit_code() const noexcept {
  switch (kind_) {
    case Kind::Config: return exit_code::kConfig;
    case Kind::Checkpoint: return exit_code::kCheckpoint;
    case Kind::Comm: return exit_code::kComm;
    case Kind::Request: return exit_code::kRequest;
    case Kind::Io: return exit_code::kIo;
    case Kind::Device: return exit_code::kDevice;
    case Kind::Internal: break;
  }
  return exit_code::kInternal;
}

void rethrow_on_all_ranks(const Error& e) {
  switch (e.kind()) {
    case Error::Kind::Config: throw ConfigError(e.what(), true);
    case Error::Kind::Checkpoint: throw CheckpointError(e.what(), true);
    case Error::Kind::Comm: throw CommError(e.what(), true);
    case Error::Kind::Request: throw RequestError(e.what(), true);
    case Error::Kind::Io: throw IoError(e.what(), true);
    case Error::Kind::Device: throw DeviceError(e.what(), true);
    case Error::Kind::Internal: break;
  }
  throw Error(Error::Kind::Internal, e.what(), true);
}

void throw_io_error(const std::string& what, const std::string& path, int err) {
  throw IoError(what + ": " + path + ": " + std::strerror(err));
}

std::string clip_text(const std::string& text, size_t keep) {
  if (text.size() <= keep) return text;
  size_t cut = keep;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return text.substr(0, cut) + "\u2026(" + std::to_string(text.size()) + " chars)";
}

}  // namespace tprun
