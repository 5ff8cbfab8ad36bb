#include "jobs/results_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "jobs/output_folder.h"
#include "lora/lora_choice.h"
#include "pipelines/generation_request.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) { throw_io_error(what, path, errno); }

void write_all(int fd, const std::string& bytes, const std::string& path) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("cannot write", path);
    }
    off += static_cast<size_t>(n);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// The log is never reached through a symlink (an append would land in the
// link's target) and is a regular file (a FIFO would block the reader).
int open_log(const std::string& dir, const std::string& path, int flags) {
  check_output_entry(dir, "results.jsonl", EntryKind::File);
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT && !(flags & O_CREAT)) return -1;
    check_output_entry(dir, "results.jsonl", EntryKind::File);  // made a symlink since: say so
    throw_io_error("cannot open", path, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    check_output_entry(dir, "results.jsonl", EntryKind::File);
    throw_io_error("cannot open", path, EINVAL);
  }
  // Blocking I/O from here on.
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    throw_io_error("cannot open", path, err);
  }
  return fd;
}

// The whole log ("" when there is none).
std::string read_log(const std::string& dir, const std::string& path) {
  const int fd = open_log(dir, path, O_RDONLY);
  if (fd < 0) return "";
  std::string all;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw_io_error("cannot read", path, err);
    }
    if (n == 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return all;
}

bool exists_no_follow(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  // A fresh name (mkstemp: O_CREAT | O_EXCL), so a symlink planted at a
  // predictable temporary name is never followed.
  std::string tmp = (dir / fmt::format(".{}.tmp-XXXXXX", p.filename().string())).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw_io_error(fmt::format("cannot create a temporary file in {} for", dir.string()), path, errno);
  try {
    if (::fchmod(fd, 0644) != 0) io_fail("cannot set the mode of", tmp);
    write_all(fd, bytes, tmp);
    if (::fsync(fd) != 0) io_fail("cannot flush", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_io_error("cannot rename into", path, err);
  }
  fsync_dir(dir.string());
}

nlohmann::json ResultRecord::to_json() const {
  nlohmann::json j = {{"id", id},
                      {"status", status},
                      {"path", path},
                      {"seed", seed},
                      {"height", height},
                      {"width", width},
                      {"steps", steps},
                      {"timings",
                       {{"encode_s", encode_s},
                        {"denoise_s", denoise_s},
                        {"decode_s", decode_s},
                        {"total_s", encode_s + denoise_s + decode_s}}},
                      {"replica", replica},
                      {"error", error}};
  // Only a frame sequence says so: an image's line is what it always was.
  if (frames != 1) {
    j["frames"] = frames;
    if (fps > 0) j["fps"] = fps;
  }
  // Only a request with adapters says so: a line without them is what it always was.
  if (!loras.empty()) {
    nlohmann::json a = nlohmann::json::array();
    for (const LoraRecord& l : loras) {
      a.push_back({{"path", l.path}, {"resolved", l.resolved}, {"scale", l.scale}, {"xxh3", l.xxh3}});
    }
    j["loras"] = std::move(a);
  }
  return j;
}

namespace {

// Fields of a record read back: each of its JSON type and in range, or a
// std::runtime_error naming it (a float or a huge number is never cast).
const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string text_field(const nlohmann::json& j, const char* key, bool required) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) {
    if (required) throw std::runtime_error(fmt::format("\"{}\" is missing", key));
    return "";
  }
  if (!v->is_string()) {
    throw std::runtime_error(fmt::format("\"{}\" must be a string, found {}", key, clip_text(v->dump())));
  }
  return v->get<std::string>();
}

template <typename T>
T int_field(const nlohmann::json& j, const char* key) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) return T{0};
  if (v->is_number_unsigned() && v->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return static_cast<T>(v->get<uint64_t>());
  }
  if (v->is_number_integer() && !v->is_number_unsigned() && v->get<int64_t>() >= 0 &&
      static_cast<uint64_t>(v->get<int64_t>()) <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return static_cast<T>(v->get<int64_t>());
  }
  throw std::runtime_error(
      fmt::format("\"{}\" must be an integer from 0 to {}, found {}", key, std::numeric_limits<T>::max(),
                  clip_text(v->dump())));
}

double seconds_field(const nlohmann::json& t, const char* key) {
  const nlohmann::json* v = field(t, key);
  if (v == nullptr) return 0;
  if (!v->is_number()) throw std::runtime_error(fmt::format("\"timings.{}\" must be a number", key));
  return v->get<double>();
}

// "loras": at most lora::kMaxLorasPerRequest objects, each with its path,
// resolved file, a finite scale within the bound and a 32-digit hex hash.
std::vector<LoraRecord> loras_field(const nlohmann::json& j) {
  const nlohmann::json* v = field(j, "loras");
  if (v == nullptr) return {};
  if (!v->is_array()) throw std::runtime_error(fmt::format("\"loras\" must be an array, found {}", clip_text(v->dump())));
  if (v->size() > lora::kMaxLorasPerRequest) {
    throw std::runtime_error(
        fmt::format("\"loras\" holds {} adapters, more than {}", v->size(), lora::kMaxLorasPerRequest));
  }
  std::vector<LoraRecord> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const nlohmann::json& e = (*v)[i];
    if (!e.is_object()) throw std::runtime_error(fmt::format("\"loras\"[{}] must be an object", i));
    LoraRecord l;
    try {
      l.path = text_field(e, "path", true);
      l.resolved = text_field(e, "resolved", true);
      l.xxh3 = text_field(e, "xxh3", true);
    } catch (const std::runtime_error& x) {
      throw std::runtime_error(fmt::format("\"loras\"[{}]: {}", i, x.what()));
    }
    const nlohmann::json* scale = field(e, "scale");
    if (scale == nullptr || !scale->is_number() || !(std::fabs(scale->get<double>()) <= lora::kMaxLoraScale)) {
      throw std::runtime_error(fmt::format("\"loras\"[{}]: \"scale\" must be a number from {} to {}", i,
                                           -lora::kMaxLoraScale, lora::kMaxLoraScale));
    }
    l.scale = scale->get<double>();
    bool hex = l.xxh3.size() == 32;
    for (char c : l.xxh3) hex = hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    if (!hex) {
      throw std::runtime_error(fmt::format("\"loras\"[{}]: \"xxh3\" must be 32 hex digits, found '{}'", i,
                                           clip_text(l.xxh3)));
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

ResultRecord ResultRecord::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  ResultRecord r;
  r.id = text_field(j, "id", true);
  r.status = text_field(j, "status", true);
  r.path = text_field(j, "path", false);
  r.seed = int_field<uint64_t>(j, "seed");
  r.height = int_field<int64_t>(j, "height");
  r.width = int_field<int64_t>(j, "width");
  r.steps = int_field<int64_t>(j, "steps");
  if (field(j, "frames") != nullptr) {
    r.frames = int_field<int64_t>(j, "frames");
    if (r.frames < 1 || r.frames > pipelines::kMaxFrames) {
      throw std::runtime_error(
          fmt::format("\"frames\" must be an integer from 1 to {}, found {}", pipelines::kMaxFrames, r.frames));
    }
  }
  if (field(j, "fps") != nullptr) {
    r.fps = int_field<int64_t>(j, "fps");
    if (r.fps < 1 || r.fps > pipelines::kMaxFps) {
      throw std::runtime_error(
          fmt::format("\"fps\" must be an integer from 1 to {}, found {}", pipelines::kMaxFps, r.fps));
    }
  }
  if (const nlohmann::json* t = field(j, "timings"); t != nullptr && t->is_object()) {
    r.encode_s = seconds_field(*t, "encode_s");
    r.denoise_s = seconds_field(*t, "denoise_s");
    r.decode_s = seconds_field(*t, "decode_s");
  }
  r.replica = int_field<int>(j, "replica");
  r.error = text_field(j, "error", false);
  r.loras = loras_field(j);
  return r;
}

std::string record_file(const std::string& path) { return path.substr(0, path.find(':')); }

std::string record_path_problem(const std::string& path) {
  if (path.empty()) return "";
  if (path.size() > 4096) return "is longer than 4096 bytes";
  for (const char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) return "holds a control character";
  }
  const std::string file = record_file(path);
  if (file.empty()) return "names no file before its ':'";
  if (file[0] == '/') return "is an absolute path";
  size_t start = 0;
  int parts = 0;
  std::string first;
  for (;;) {
    const size_t slash = file.find('/', start);
    const std::string part = file.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty()) return "has an empty component ('//' or a trailing '/')";
    if (part == "..") return "has a '..' component (it leaves the folder)";
    if (part[0] == '.') return fmt::format("has a component starting with '.' ('{}')", clip_text(part));
    if (parts++ == 0) first = part;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (parts < 2 || (first != "images" && first != "store" && first != "videos")) {
    return "is not a file under images/, videos/ or store/";
  }
  return "";
}

ResultRecord parse_result_record(const std::string& line) {
  ResultRecord r;
  try {
    r = ResultRecord::from_json(nlohmann::json::parse(line));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(e.what());
  }
  if (r.id.empty()) throw std::runtime_error("\"id\" is empty");
  if (r.status != "done" && r.status != "failed") {
    throw std::runtime_error("\"status\" is '" + clip_text(r.status) + "', not done or failed");
  }
  const std::string why = record_path_problem(r.path);
  if (!why.empty()) {
    throw std::runtime_error(fmt::format("request '{}': \"path\" '{}' {}: not a plain relative path inside the "
                                         "output folder",
                                         clip_text(r.id), clip_text(r.path, 300), why));
  }
  return r;
}

ResultsLog::ResultsLog(std::string dir) : dir_(std::move(dir)), path_((fs::path(dir_) / "results.jsonl").string()) {
  const std::string all = read_log(dir_, path_);
  std::map<std::string, int64_t> done_on;  // id -> the line of its `done` record
  size_t start = 0;
  int64_t number = 0;
  while (start < all.size()) {
    ++number;
    const size_t nl = all.find('\n', start);
    const bool last = nl == std::string::npos;
    const std::string line = all.substr(start, last ? std::string::npos : nl - start);
    start = last ? all.size() : nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (last) needs_newline_ = true;
      else intact_bytes_ = static_cast<int64_t>(start);
      continue;
    }
    // No final newline and not a whole JSON value: a writer died mid-line,
    // the one line the log may drop. A whole value is checked like any line.
    if (last && !nlohmann::json::accept(line)) {
      torn_ = 1;
      torn_text_ = line;
      break;
    }
    std::string why;
    try {
      ResultRecord r = parse_result_record(line);
      const auto seen = done_on.find(r.id);
      if (seen != done_on.end()) {
        throw ConfigError(fmt::format("{}:{}: request '{}' is recorded again after its `done` record on line {} (a "
                                      "request is done once); the file is left as it was: remove one of the two "
                                      "lines, then rerun",
                                      path_, number, clip_text(r.id), seen->second),
                          true);
      }
      if (r.status == "done") done_on.emplace(r.id, number);
      records_[r.id] = r;
      lines_.push_back(line);
      line_ids_.push_back(r.id);
      if (last) needs_newline_ = true;
      else intact_bytes_ = static_cast<int64_t>(start);
      continue;
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      why = e.what();
    }
    // A complete line that is no record: not an interrupted write but
    // someone's text. Leave the file as it is.
    throw ConfigError(fmt::format("{}:{}: not a result record ({}): '{}'; the file is left as it was: fix or remove "
                                  "that line, then rerun",
                                  path_, number, clip_text(why, 400), clip_text(line)),
                      true);
  }
}

ResultsLog::~ResultsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void ResultsLog::begin(const std::set<std::string>& rerun) {
  bool drop = false;
  for (const auto& id : line_ids_) drop = drop || rerun.count(id) != 0;
  for (const auto& id : rerun) records_.erase(id);
  if (drop || !exists_no_follow(path_)) {
    // Records of ids that run again go (no id is recorded twice): rewritten whole.
    std::string kept;
    for (size_t i = 0; i < lines_.size(); ++i) {
      if (rerun.count(line_ids_[i])) continue;
      kept += lines_[i];
      kept += '\n';
    }
    write_file_atomic(path_, kept);
    needs_newline_ = false;
  } else if (torn_ > 0) {
    // Only the torn tail goes; the user's lines stay as they are, in place.
    const int fd = open_log(dir_, path_, O_WRONLY);
    if (::ftruncate(fd, intact_bytes_) != 0 || ::fdatasync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      throw_io_error("cannot cut the torn last line off", path_, err);
    }
    ::close(fd);
  }
  fd_ = open_log(dir_, path_, O_WRONLY | O_APPEND);
  if (fd_ < 0) throw_io_error("cannot open", path_, ENOENT);
}

void ResultsLog::append(const ResultRecord& r) {
  if (fd_ < 0) throw Error(Error::Kind::Internal, "ResultsLog::append before begin");
  struct stat st {};
  if (::fstat(fd_, &st) != 0) io_fail("cannot stat", path_);
  try {
    write_all(fd_, (needs_newline_ ? "\n" : "") + r.to_json().dump() + "\n", path_);
    if (::fdatasync(fd_) != 0) io_fail("cannot flush", path_);
    needs_newline_ = false;
  } catch (const IoError& e) {
    // Cut the log back to its last complete line: no half record stays.
    if (::ftruncate(fd_, st.st_size) != 0) {
      throw IoError(fmt::format("{}; cutting {} back to {} bytes failed too: {}", e.what(), path_, st.st_size,
                                std::strerror(errno)));
    }
    ::fdatasync(fd_);
    throw;
  }
  records_[r.id] = r;
}

}  // namespace tprun::jobs
