// A job's adapters as its results name them (lora_records.h).
#include "jobs/lora_records.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <memory>
#include <new>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace tprun::jobs {

namespace {

// Closes the descriptor on every way out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// "0.7" as the log shows a scale.
std::string scale_text(double s) { return fmt::format("{}", s); }

std::string describe(const std::vector<LoraRecord>& set) {
  if (set.empty()) return "none";
  std::string out;
  for (const auto& l : set) {
    out += fmt::format("{}{} x{} (xxh3 {})", out.empty() ? "" : ", ", clip_text(l.path, 200), scale_text(l.scale),
                       l.xxh3.substr(0, 12));
  }
  return out;
}

}  // namespace

std::string lora_file_hash(const std::string& path) {
  Fd f;
  do {
    f.fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  } while (f.fd < 0 && errno == EINTR);
  if (f.fd < 0) {
    if (errno == ELOOP) {
      throw ConfigError(fmt::format("LoRA adapter {}: became a symlink since it was checked; rerun", path), true);
    }
    throw_io_error("cannot open the LoRA adapter", path, errno);
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw_io_error("cannot stat the LoRA adapter", path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw ConfigError(fmt::format("LoRA adapter {}: is not a regular file (any more)", path), true);
  }
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_128bits_reset(state.get());
  std::unique_ptr<char[]> buf(new char[kLoraHashChunk]);
  for (;;) {
    const ssize_t n = ::read(f.fd, buf.get(), kLoraHashChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error("cannot read the LoRA adapter", path, errno);
    if (n == 0) break;
    XXH3_128bits_update(state.get(), buf.get(), static_cast<size_t>(n));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state.get());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

LoraHashes hash_lora_files(const std::vector<JobRequest>& requests, uint64_t* bytes) {
  LoraHashes out;
  uint64_t total = 0;
  for (const JobRequest& r : requests) {
    for (const auto& c : r.gen.lora_set()) {
      if (out.count(c.path)) continue;
      out[c.path] = lora_file_hash(c.path);
      struct stat st {};
      if (::stat(c.path.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
    }
  }
  if (bytes) *bytes = total;
  return out;
}

std::string lora_hashes_json(const LoraHashes& hashes) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [path, hash] : hashes) j[path] = hash;
  return j.dump();
}

LoraHashes parse_lora_hashes(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json);
  if (!j.is_object()) throw std::runtime_error("the adapters' hashes are not a JSON object");
  LoraHashes out;
  for (const auto& [path, hash] : j.items()) {
    if (!hash.is_string()) throw std::runtime_error("an adapter's hash is not a string");
    out[path] = hash.get<std::string>();
  }
  return out;
}

std::vector<LoraRecord> lora_records(const JobRequest& r, const Manifest& m, const LoraHashes& hashes) {
  const auto& set = r.gen.lora_set();
  const std::vector<std::string>& written = r.own_loras ? r.lora_written : m.lora_written;
  std::vector<LoraRecord> out;
  for (size_t i = 0; i < set.size(); ++i) {
    const auto it = hashes.find(set[i].path);
    if (it == hashes.end()) {
      throw Error(Error::Kind::Internal, fmt::format("request {}: the adapter {} was not hashed", r.id, set[i].path));
    }
    out.push_back({i < written.size() ? written[i] : set[i].path, set[i].path, set[i].scale, it->second});
  }
  return out;
}

std::string lora_records_json(const std::vector<LoraRecord>& records) {
  if (records.empty()) return "";
  ResultRecord r;
  r.loras = records;
  return r.to_json().at("loras").dump();
}

LoraChange lora_change(const std::vector<LoraRecord>& recorded, const std::vector<LoraRecord>& now) {
  LoraChange c;
  if (recorded.size() != now.size()) {
    c.content = true;
  } else {
    for (size_t i = 0; i < now.size(); ++i) {
      if (recorded[i].xxh3 != now[i].xxh3 || recorded[i].scale != now[i].scale) c.content = true;
      if (recorded[i].path != now[i].path || recorded[i].resolved != now[i].resolved) c.names = true;
    }
  }
  if (c.content || c.names) {
    c.what = fmt::format("recorded with adapters [{}], now asks for [{}]", describe(recorded), describe(now));
  }
  return c;
}

std::vector<std::vector<lora::LoraChoice>> distinct_lora_sets(const std::vector<const JobRequest*>& requests) {
  std::vector<std::vector<lora::LoraChoice>> out;
  std::set<std::string> seen;
  for (const JobRequest* r : requests) {
    const auto& set = r->gen.lora_set();
    if (seen.insert(lora::lora_set_key(set)).second) out.push_back(set);
  }
  return out;
}

}  // namespace tprun::jobs
