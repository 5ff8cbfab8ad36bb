#include "jobs/results_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

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

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const fs::path p(path);
  const std::string tmp = (p.parent_path() / fmt::format(".{}.tmp-{}", p.filename().string(), ::getpid())).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot create", tmp);
  try {
    write_all(fd, bytes, tmp);
    if (::fsync(fd) != 0) io_fail("cannot flush", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    io_fail("cannot rename into", path);
  }
  fsync_dir(p.parent_path().empty() ? "." : p.parent_path().string());
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
  return j;
}

ResultRecord ResultRecord::from_json(const nlohmann::json& j) {
  ResultRecord r;
  r.id = j.at("id").get<std::string>();
  r.status = j.at("status").get<std::string>();
  r.path = j.value("path", std::string());
  r.seed = j.value("seed", uint64_t{0});
  r.height = j.value("height", int64_t{0});
  r.width = j.value("width", int64_t{0});
  r.steps = j.value("steps", int64_t{0});
  if (j.contains("timings") && j["timings"].is_object()) {
    r.encode_s = j["timings"].value("encode_s", 0.0);
    r.denoise_s = j["timings"].value("denoise_s", 0.0);
    r.decode_s = j["timings"].value("decode_s", 0.0);
  }
  r.replica = j.value("replica", 0);
  r.error = j.value("error", std::string());
  return r;
}

ResultsLog::ResultsLog(std::string dir) : dir_(std::move(dir)), path_((fs::path(dir_) / "results.jsonl").string()) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    if (fs::exists(path_)) io_fail("cannot read", path_);
    return;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) io_fail("cannot read", path_);
  const std::string all = ss.str();
  size_t start = 0;
  int64_t number = 0;
  while (start < all.size()) {
    ++number;
    const size_t nl = all.find('\n', start);
    if (nl == std::string::npos) {  // no final newline: a writer died mid-line; the one line it may drop
      torn_ = 1;
      torn_text_ = all.substr(start);
      break;
    }
    const std::string line = all.substr(start, nl - start);
    start = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string why;
    try {
      const auto j = nlohmann::json::parse(line);
      ResultRecord r = ResultRecord::from_json(j);
      if (r.id.empty()) throw std::runtime_error("\"id\" is empty");
      if (r.status != "done" && r.status != "failed") {
        throw std::runtime_error("\"status\" is '" + clip_text(r.status) + "', not done or failed");
      }
      records_[r.id] = r;
      lines_.push_back(line);
      line_ids_.push_back(r.id);
      continue;
    } catch (const std::exception& e) {
      why = e.what();
    }
    // A complete line (it ends in a newline) that is no record: not an
    // interrupted write but someone's text. Leave the file as it is.
    throw ConfigError(fmt::format("{}:{}: not a result record ({}): '{}'; the file is left as it was: fix or remove "
                                  "that line, then rerun",
                                  path_, number, clip_text(why, 120), clip_text(line)),
                      true);
  }
}

ResultsLog::~ResultsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void ResultsLog::begin(const std::set<std::string>& rerun) {
  std::string kept;
  for (size_t i = 0; i < lines_.size(); ++i) {
    if (rerun.count(line_ids_[i])) continue;
    kept += lines_[i];
    kept += '\n';
  }
  for (const auto& id : rerun) records_.erase(id);
  if (!lines_.empty() || torn_ > 0 || !fs::exists(path_)) write_file_atomic(path_, kept);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) io_fail("cannot open", path_);
}

void ResultsLog::append(const ResultRecord& r) {
  if (fd_ < 0) throw Error(Error::Kind::Internal, "ResultsLog::append before begin");
  struct stat st {};
  if (::fstat(fd_, &st) != 0) io_fail("cannot stat", path_);
  try {
    write_all(fd_, r.to_json().dump() + "\n", path_);
    if (::fdatasync(fd_) != 0) io_fail("cannot flush", path_);
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
