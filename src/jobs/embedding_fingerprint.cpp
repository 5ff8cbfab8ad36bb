#include "jobs/embedding_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/safetensors_source.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

// Bumped when what the fingerprint covers, or how, changes.
constexpr const char* kFingerprintFormat = "tprun-embedding-fingerprint-2";
constexpr uint64_t kReadChunk = 1ull << 20;

// XXH3-128 over length-prefixed fields, so that no two different sequences
// of fields feed the same bytes.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    XXH3_128bits_reset(state_);
  }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void raw(const void* data, size_t n) {
    if (n > 0) XXH3_128bits_update(state_, data, n);
  }
  void number(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    raw(b, 8);
  }
  void field(const std::string& s) {
    number(s.size());
    raw(s.data(), s.size());
  }
  std::string hex() const {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
  }

 private:
  XXH3_state_t* state_;
};

// One entry of a component folder, named relative to it ('/'-separated).
struct Listed {
  std::string rel;
  fs::path path;     // what to stat and read (a followed link's target)
  std::string link;  // for a link not followed: "<kind> -> <its target text>"
};

// The state of walking one component folder.
struct Walk {
  fs::path model_root;  // canonical
  std::string folder;   // the component folder, for messages
  std::set<std::string> visited;  // canonical folders walked
  std::vector<Listed> files;
  int64_t entries = 0;
};

bool inside(const fs::path& target, const fs::path& root) {
  const fs::path rel = target.lexically_relative(root);
  return !rel.empty() && *rel.begin() != "..";
}

[[noreturn]] void fail_fs(const fs::path& path, const char* what, const std::error_code& ec) {
  throw CheckpointError(fmt::format("{}: {} for the embedding fingerprint: {}", path.string(), what, ec.message()));
}

void walk_folder(Walk& w, const fs::path& dir, const std::string& prefix);

// A symlink: a file is followed wherever it lies (read only); a folder only
// inside the model folder and once; otherwise its target text stands for it.
void visit_link(Walk& w, const fs::path& link, const std::string& rel) {
  std::error_code ec;
  const std::string text = fs::read_symlink(link, ec).string();
  if (ec) fail_fs(link, "cannot read the link", ec);
  const fs::path target = fs::canonical(link, ec);
  if (ec) {
    w.files.push_back({rel, {}, "dangling -> " + text});
    return;
  }
  if (!fs::is_directory(target, ec)) {
    w.files.push_back({rel, target, ""});
    return;
  }
  if (inside(target, w.model_root) && w.visited.count(target.string()) == 0) {
    walk_folder(w, target, rel + "/");
  } else {
    w.files.push_back({rel, {}, "folder -> " + text});
  }
}

// The entries of `dir` (counted against kFingerprintMaxFiles), sorted by name.
std::vector<fs::directory_entry> sorted_entries(Walk& w, const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) fail_fs(dir, "cannot list the folder", ec);
  std::vector<fs::directory_entry> entries;
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) fail_fs(dir, "cannot list the folder", ec);
    if (++w.entries > kFingerprintMaxFiles) {
      throw CheckpointError(fmt::format("{}: more than {} files in this component folder; the embedding "
                                        "fingerprint reads at most that many (remove what the model does not need)",
                                        w.folder, kFingerprintMaxFiles));
    }
    entries.push_back(*it);
  }
  if (ec) fail_fs(dir, "cannot list the folder", ec);
  std::sort(entries.begin(), entries.end(),
            [](const fs::directory_entry& a, const fs::directory_entry& b) { return a.path() < b.path(); });
  return entries;
}

void walk_folder(Walk& w, const fs::path& dir, const std::string& prefix) {
  std::error_code ec;
  const fs::path canon = fs::canonical(dir, ec);
  if (ec) fail_fs(dir, "cannot resolve the folder", ec);
  w.visited.insert(canon.string());
  for (const auto& entry : sorted_entries(w, dir)) {
    const std::string rel = prefix + entry.path().filename().string();
    const fs::file_status st = entry.symlink_status(ec);
    if (ec) fail_fs(entry.path(), "cannot stat", ec);
    if (fs::is_symlink(st)) {
      visit_link(w, entry.path(), rel);
    } else if (fs::is_directory(st)) {
      walk_folder(w, entry.path(), rel + "/");
    } else {
      w.files.push_back({rel, entry.path(), ""});
    }
  }
}

// Feeds the first `size` bytes of `path` (a regular file of that size).
void hash_file_bytes(Hasher& h, const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::unique_ptr<char[]> buffer(new char[static_cast<size_t>(std::min(size, kReadChunk)) + 1]);
  for (uint64_t done = 0; done < size;) {
    const uint64_t len = std::min(kReadChunk, size - done);
    checkpoint::pread_fully(fd, buffer.get(), len, done, path);  // CheckpointError when it shrank meanwhile
    h.raw(buffer.get(), static_cast<size_t>(len));
    done += len;
  }
}

// A file by its bytes, or (over kFingerprintBytesLimit) its size and mtime;
// a link not followed by its text; anything else (a FIFO, a socket) by its name.
void hash_listed(Hasher& h, const Listed& f) {
  h.field(f.rel);
  if (!f.link.empty()) {
    h.field("link");
    h.field(f.link);
    return;
  }
  struct stat st {};
  if (::stat(f.path.c_str(), &st) != 0)
    throw CheckpointError(fmt::format("{}: cannot stat: {}", f.path.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    h.field("special");
    return;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= kFingerprintBytesLimit) {
    h.field("bytes");
    h.number(size);
    hash_file_bytes(h, f.path.string(), size);
    return;
  }
  h.field("large");
  h.number(size);
  h.number(static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec));
}

bool feeds_text_encoding(const std::string& component) {
  return component.rfind("text_encoder", 0) == 0 || component.rfind("tokenizer", 0) == 0;
}

}  // namespace

std::string embedding_fingerprint(const std::string& model_folder, const std::string& settings) {
  const checkpoint::PipelineFolder pipeline = checkpoint::open_pipeline_folder(model_folder);
  std::error_code ec;
  const fs::path root = fs::canonical(model_folder, ec);
  if (ec) fail_fs(model_folder, "cannot resolve the model folder", ec);
  Hasher h;
  h.field(kFingerprintFormat);
  h.field(pipeline.cls);
  hash_listed(h, {"model_index.json", root / "model_index.json", ""});
  for (const auto& component : pipeline.components) {
    if (!feeds_text_encoding(component.name)) continue;
    Walk w{root, component.path, {}, {}, 0};
    walk_folder(w, component.path, "");
    std::sort(w.files.begin(), w.files.end(), [](const Listed& a, const Listed& b) { return a.rel < b.rel; });
    h.field("component");
    h.field(component.name);
    h.number(w.files.size());
    for (const auto& f : w.files) hash_listed(h, f);
  }
  h.field("settings");
  h.field(settings);
  return h.hex();
}

}  // namespace tprun::jobs
