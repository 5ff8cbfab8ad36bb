#include "jobs/merge_results.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "jobs/output_folder.h"
#include "jobs/results_log.h"
#include "jobs/mp4_file.h"
#include "jobs/video_output.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

std::string chunk_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// "shard-I-of-N" (the folders `tprun run --shard I/N` writes) -> I, N.
bool shard_of(const std::string& name, int64_t& index, int64_t& count) {
  auto number = [&](size_t& at, int64_t& v) {
    const size_t from = at;
    v = 0;
    while (at < name.size() && at - from < 9 && name[at] >= '0' && name[at] <= '9') v = v * 10 + (name[at++] - '0');
    return at > from;
  };
  if (name.rfind("shard-", 0) != 0) return false;
  size_t at = 6;
  if (!number(at, index) || name.compare(at, 4, "-of-") != 0) return false;
  at += 4;
  return number(at, count) && at == name.size() && index < count;
}

// Chunk folders named shard-I-of-N are an array: every I in 0..N-1 is given,
// or (partial) the missing ones are named in a warning.
void check_array(const std::vector<std::string>& dirs, const MergeOptions& options, MergeSummary& s) {
  std::map<int64_t, std::set<int64_t>> by_count;
  for (const auto& d : dirs) {
    int64_t i = 0, n = 0;
    if (!shard_of(chunk_name(d), i, n)) return;  // not (all) array chunks: nothing to compare
    by_count[n].insert(i);
  }
  if (by_count.size() > 1) {
    std::string splits;
    for (const auto& [n, have] : by_count) splits += fmt::format("{}of-{}", splits.empty() ? "" : ", ", n);
    throw ConfigError(fmt::format("merge-results: the chunks come from different splits ({}); only the chunks of one "
                                  "`--shard I/N` array hold each request once",
                                  splits),
                      true);
  }
  const auto& [n, have] = *by_count.begin();
  const int64_t missing = n - static_cast<int64_t>(have.size());
  if (missing == 0) return;
  std::string list;
  for (int64_t i = 0; i < n && s.missing_chunks.size() < 8; ++i) {
    if (!have.count(i)) s.missing_chunks.push_back(fmt::format("shard-{}-of-{}", i, n));
  }
  for (const auto& m : s.missing_chunks) list += (list.empty() ? "" : ", ") + m;
  if (missing > static_cast<int64_t>(s.missing_chunks.size())) {
    list += fmt::format(" and {} more", missing - static_cast<int64_t>(s.missing_chunks.size()));
  }
  if (!options.partial) {
    throw ConfigError(fmt::format("merge-results: {} of the {} chunks of the array are not given: {}; name every "
                                  "chunk folder, or pass --partial to merge these alone",
                                  missing, n, list),
                      true);
  }
  spdlog::warn("merge-results: --partial: {} of the {} chunks of the array are not merged: {}; their requests are "
               "not in the merged results",
               missing, n, list);
}

// Whether --out holds the marker of an earlier merge (a regular file, not a
// symlink, holding {"merged_by": "tprun merge-results", ...}).
bool merged_here(const fs::path& out) {
  const fs::path marker = out / kMergedMarker;
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(marker, ec)) || fs::file_size(marker, ec) > (1 << 20) || ec) return false;
  std::ifstream in(marker, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() && j.value("merged_by", "") == "tprun merge-results";
}

// Whether the regular file `b` holds exactly the bytes of `a`.
bool same_bytes(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(b, ec)) || fs::file_size(a, ec) != fs::file_size(b, ec) || ec) {
    return false;
  }
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 16), bb(1 << 16);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() || std::memcmp(ba.data(), bb.data(), static_cast<size_t>(fa.gcount())) != 0) {
      return false;
    }
  }
  return fa.eof() && fb.eof();
}

// `src` copied to the new file `to` (O_EXCL | O_NOFOLLOW: never over a file, never through a symlink).
void copy_exclusive(const fs::path& src, const fs::path& to) {
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw_io_error("merge-results: cannot read", src.string(), errno);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    throw_io_error(fmt::format("merge-results: cannot copy {} to", src.string()), to.string(), err);
  }
  std::vector<char> buf(1 << 20);
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : 0;
      break;
    }
    for (ssize_t off = 0; off < n && err == 0;) {
      const ssize_t w = ::write(out, buf.data() + off, static_cast<size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) err = errno;
      else off += w;
    }
    if (err != 0) break;
  }
  if (err == 0 && ::fsync(out) != 0) err = errno;
  ::close(in);
  if (::close(out) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(to.c_str());
    throw_io_error(fmt::format("merge-results: cannot copy {} to", src.string()), to.string(), err);
  }
}

// --out is no chunk, not inside one, and holds no results.jsonl that
// merge-results did not write; its images/ and store/ are its own folders.
void check_out(const std::string& out_dir, const fs::path& out, const std::vector<std::string>& dirs,
               const std::vector<fs::path>& chunks) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (out == chunks[i]) {
      throw ConfigError(fmt::format("merge-results: --out {} is the chunk folder {}: the merged results.jsonl would "
                                    "replace the chunk's own; pick another --out (the folder that holds the chunks "
                                    "is fine)",
                                    out_dir, dirs[i]),
                        true);
    }
    if (path_within(out, chunks[i])) {
      throw ConfigError(fmt::format("merge-results: --out {} is inside the chunk folder {}; pick a folder outside "
                                    "the chunks",
                                    out_dir, dirs[i]),
                        true);
    }
  }
  std::error_code ec;
  const auto st = fs::status(out, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) throw ConfigError(fmt::format("merge-results: --out {} is not a folder", out_dir), true);
  if (fs::exists(fs::symlink_status(out / "results.jsonl", ec)) && !merged_here(out)) {
    throw ConfigError(fmt::format("merge-results: --out {} holds a results.jsonl that merge-results did not write (a "
                                  "run's own log, or a chunk's): the merge would replace it; pick another --out",
                                  out_dir),
                      true);
  }
  for (const char* sub : {"images", "videos", "store"}) {
    if (fs::is_symlink(fs::symlink_status(out / sub, ec))) {
      throw ConfigError(fmt::format("merge-results: --out {}: {} is a symbolic link; the merged files must land "
                                    "inside --out: remove it",
                                    out_dir, (out / sub).string()),
                        true);
    }
  }
  for (const char* file : {"results.jsonl", kMergedMarker}) {
    try {
      check_output_entry(out, file, EntryKind::File);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("merge-results: --out: ") + e.what(), true);
    }
  }
}

// The place in --out of each merged file (`dst`, below --out): every folder
// along it a real folder (no symlink leading out), and the file there, if
// any, one the merge may replace: the same file (merged before), a PNG tprun
// wrote, or the same bytes (a store file copied by an earlier merge across
// file systems). Anything else is refused before anything is written.
void check_place(const fs::path& out, const std::string& src, const std::string& dst) {
  std::error_code ec;
  fs::path at = out;
  const fs::path rel(dst);
  for (auto it = rel.begin(); it != rel.end() && std::next(it) != rel.end(); ++it) {  // the file itself: below
    try {
      check_output_entry(at, it->string(), EntryKind::Folder);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("merge-results: --out: ") + e.what(), true);
    }
    at /= *it;
  }
  const fs::path to = out / rel;
  if (!fs::exists(fs::symlink_status(to, ec))) return;
  if (fs::is_regular_file(fs::symlink_status(to, ec)) && fs::equivalent(src, to, ec)) return;
  std::string why;
  if (to.extension() == ".png") {
    why = foreign_output(to.string(), OutputKind::Png);
  } else if (to.extension() == ".mp4") {
    why = foreign_output(to.string(), OutputKind::Mp4);
  } else if (!same_bytes(src, to)) {
    why = "exists and is not the file merged from the chunk";
  }
  if (!why.empty()) {
    throw ConfigError(fmt::format("merge-results: {} {}; tprun never replaces a file it did not write: move it away, "
                                  "or choose another --out; nothing was merged",
                                  to.string(), why),
                      true);
  }
}

// The merged folder's files, placed all or nothing: each file hard-linked
// (copied across file systems) under a temporary name next to its place, then
// all renamed into place and results.jsonl written last. Until commit()
// returns, destruction removes the temporaries, the folders made and --out
// itself when this merge created it.
class Staging {
 public:
  explicit Staging(fs::path out) : out_(std::move(out)) {
    std::error_code ec;
    for (fs::path p = out_; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
      created_root_ = p;
      if (p == p.parent_path()) break;
    }
    fs::create_directories(out_, ec);
    if (ec) throw_io_error("merge-results: cannot create --out", out_.string(), ec.value());
    try {
      lock_ = OutputLock::acquire(out_.string());  // one writer of --out: no run, no other merge
    } catch (...) {
      rollback();
      throw;
    }
    // Temporaries of a merge that was killed (only merges make these names; the lock is ours).
    ec.clear();
    for (const char* sub : {"images", "videos", "store"}) {
      for (fs::directory_iterator it(out_ / sub, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string n = it->path().filename().string();
        std::error_code fec;
        if (n[0] == '.' && n.find(".tmp-merge-") != std::string::npos && it->is_regular_file(fec)) {
          fs::remove(it->path(), fec);
        }
      }
      ec.clear();
    }
  }
  ~Staging() {
    if (!committed_) rollback();
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // `src`: a resolved regular file; `dst`: a plain relative path (check_place accepted its place).
  void stage(const fs::path& src, const std::string& dst) {
    const fs::path to = out_ / dst;
    std::error_code ec;
    const auto st = fs::symlink_status(to, ec);
    if (fs::is_directory(st)) {
      throw ConfigError(fmt::format("merge-results: {} is a folder; the merged file {} cannot go there", to.string(),
                                    dst),
                        true);
    }
    if (fs::is_regular_file(st) && fs::equivalent(src, to, ec)) return;  // merged before: already this file
    if (to.extension() != ".png" && to.extension() != ".mp4" && same_bytes(src, to)) return;  // an earlier merge's copy
    make_folders(fs::path(dst).parent_path());
    const fs::path tmp = to.parent_path() / fmt::format(".{}.tmp-merge-{}", to.filename().string(), ::getpid());
    fs::remove(tmp, ec);  // a leftover of this pid, or a symlink: the name itself goes, never its target
    fs::create_hard_link(src, tmp, ec);
    if (ec) copy_exclusive(src, tmp);
    temps_.emplace_back(tmp.string(), to.string());
  }

  void commit(const std::string& log, const std::string& marker) {
    for (; renamed_ < temps_.size(); ++renamed_) {
      const auto& [tmp, to] = temps_[renamed_];
      // Race-free: over a PNG tprun wrote, else only where nothing is (output_folder.h).
      const fs::path ext = fs::path(to).extension();
      if (ext == ".png") place_output_file(tmp, to, OutputKind::Png);
      else if (ext == ".mp4") place_output_file(tmp, to, OutputKind::Mp4);
      else place_new_file(tmp, to);
    }
    write_file_atomic((out_ / kMergedMarker).string(), marker);
    write_file_atomic((out_ / "results.jsonl").string(), log);
    committed_ = true;
  }

 private:
  // `rel` (below --out) made folder by folder with mkdir, none a symlink.
  void make_folders(const fs::path& rel) {
    std::error_code ec;
    fs::path at = out_;
    for (const auto& part : rel) {
      const bool fresh = !fs::exists(fs::symlink_status(at / part, ec));
      at = make_output_folder(at, part.string());
      if (fresh) made_.push_back(at);
    }
  }

  void rollback() noexcept {
    std::error_code ec;
    for (size_t i = renamed_; i < temps_.size(); ++i) fs::remove(temps_[i].first, ec);
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) fs::remove(*it, ec);  // only when empty
    lock_.reset();
    if (!created_root_.empty()) fs::remove_all(created_root_, ec);
  }

  fs::path out_, created_root_;
  std::unique_ptr<OutputLock> lock_;
  std::vector<std::pair<std::string, std::string>> temps_;  // temporary name, place
  std::vector<fs::path> made_;                              // folders created inside --out, outermost first
  size_t renamed_ = 0;
  bool committed_ = false;
};

}  // namespace

std::string output_file_problem(const std::string& dir, const std::string& rel, std::string* real) {
  std::error_code ec;
  const fs::path base = fs::canonical(dir, ec);
  if (ec) return fmt::format("its folder {} cannot be resolved ({})", dir, ec.message());
  const fs::path p = base / rel;
  if (!fs::exists(fs::symlink_status(p, ec))) return "does not exist";
  const fs::path r = fs::canonical(p, ec);  // every symlink along the path followed
  if (ec) return fmt::format("cannot be resolved ({})", ec.message());
  if (!path_within(r, base)) return fmt::format("leads outside {} through a symbolic link (to {})", dir, r.string());
  const auto st = fs::status(r, ec);
  if (!fs::is_regular_file(st)) return fs::is_directory(st) ? "is a folder, not a file" : "is not a regular file";
  if (r.extension() == ".png") {
    const std::string why = pipelines::png_incomplete(r.string());
    if (!why.empty()) return why;
  }
  if (r.extension() == ".mp4") {
    const std::string why = mp4_incomplete(r.string());
    if (!why.empty()) return "is not a complete MP4 (" + why + ")";
  }
  if (real != nullptr) *real = r.string();
  return "";
}

namespace {

// 1. The chunk folders, resolved: each a folder with a results.jsonl, none named twice.
std::vector<fs::path> resolve_chunks(const std::vector<std::string>& chunk_dirs) {
  std::vector<fs::path> chunks;
  for (const auto& dir : chunk_dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw ConfigError(fmt::format("merge-results: {} is not a folder", dir), true);
    if (!fs::is_regular_file(fs::path(dir) / "results.jsonl", ec)) {
      throw ConfigError(fmt::format("merge-results: {} has no results.jsonl", dir), true);
    }
    const fs::path c = fs::canonical(dir, ec);
    if (ec) throw_io_error("merge-results: cannot resolve", dir, ec.value());
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i] == c) {
        throw ConfigError(fmt::format("merge-results: the chunk folder {} is named twice ({})", dir, chunk_dirs[i]),
                          true);
      }
    }
    chunks.push_back(c);
  }
  return chunks;
}

struct Origin {
  ResultRecord rec;
  std::string dir;
};

// 2. Each chunk locked shared (a chunk whose run is still writing is refused),
//    its log read (record paths checked), one record per id: `done` wins over
//    `failed`, `done` twice is an error.
std::map<std::string, Origin> read_chunks(const std::vector<std::string>& chunk_dirs,
                                          std::vector<std::unique_ptr<OutputLock>>& locks, MergeSummary& s) {
  std::map<std::string, Origin> merged;
  for (const auto& dir : chunk_dirs) {
    try {
      locks.push_back(OutputLock::acquire_shared(dir));
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("merge-results: chunk {}: {}", dir, e.what()), true);
    }
    ResultsLog log(dir);
    ++s.chunks;
    for (const auto& [id, rec] : log.records()) {
      auto it = merged.find(id);
      if (it != merged.end() && it->second.rec.status == "done" && rec.status == "done") {
        throw ConfigError(fmt::format("merge-results: request '{}' is done in both {} and {}", clip_text(id),
                                      it->second.dir, dir),
                          true);
      }
      if (it == merged.end() || rec.status == "done") merged[id] = {rec, dir};
    }
  }
  return merged;
}

// 3. Every file to place in --out, each checked (inside its chunk, regular,
//    PNGs whole) before anything is written.
class MergePlan {
 public:
  explicit MergePlan(const std::string& out_dir) : out_dir_(out_dir) {}

  // Every finished store file of every chunk (a record's path names only one format).
  void add_store_files(const std::vector<std::string>& chunk_dirs) {
    for (const auto& dir : chunk_dirs) {
      const fs::path sd = fs::path(dir) / "store";
      std::error_code ec;
      if (!fs::is_directory(sd, ec)) continue;
      for (fs::directory_iterator it(sd, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string n = it->path().filename().string();
        if (n.empty() || n[0] == '.' || it->path().extension() != ".h5") continue;
        const std::string src = checked(dir, "store/" + n, "");
        const std::string dst = fmt::format("store/{}-{}", chunk_name(dir), n);
        stores_.emplace(src, dst);
        add(src, dst, (fs::path(dir) / "store" / n).string());
      }
      if (ec) throw_io_error("merge-results: cannot list", sd.string(), ec.value());
    }
  }

  // The merged log's lines: each record with its path renamed to its place in --out.
  std::string add_records(const std::map<std::string, Origin>& merged, MergeSummary& s) {
    std::string lines;
    for (const auto& [id, o] : merged) {
      ResultRecord r = o.rec;
      if (r.status == "done" && !r.path.empty()) r.path = add_record_file(id, o.dir, r.path);
      if (r.status == "done") add_video_files(id, o.dir, r.frames);
      (r.status == "done" ? s.done : s.failed)++;
      lines += r.to_json().dump() + "\n";
    }
    return lines;
  }

  // (resolved source, place in --out) of every file.
  const std::vector<std::pair<std::string, std::string>>& places() const { return places_; }

 private:
  std::string add_record_file(const std::string& id, const std::string& dir, const std::string& path) {
    const std::string file = record_file(path);
    const std::string rest = path.substr(file.size());
    const std::string log = (fs::path(dir) / "results.jsonl").string();
    const std::string src = checked(dir, file, fmt::format(" (request '{}' in {})", clip_text(id), log));
    std::string dst = file;
    if (file.rfind("store/", 0) == 0) {  // store files of several chunks may share a name
      auto [it, fresh] = stores_.emplace(src, "");
      if (fresh) it->second = fmt::format("store/{}-{}", chunk_name(dir), fs::path(file).filename().string());
      dst = it->second;
    }
    add(src, dst, fmt::format("{} (request '{}')", (fs::path(dir) / file).string(), clip_text(id)));
    return dst + rest;
  }

  // A done request's video outputs besides its record's file (a record names one format): its MP4 and
  // every frame of its frames folder, where the chunk has them.
  void add_video_files(const std::string& id, const std::string& dir, int64_t frames) {
    std::error_code ec;
    std::vector<std::string> files;
    if (fs::exists(fs::symlink_status(fs::path(dir) / mp4_output_rel(id), ec))) files.push_back(mp4_output_rel(id));
    if (fs::exists(fs::symlink_status(fs::path(dir) / frames_output_rel(id), ec))) {
      for (int64_t f = 0; f < frames; ++f) files.push_back(frames_output_rel(id) + "/" + frame_png_name(f));
    }
    const std::string log = (fs::path(dir) / "results.jsonl").string();
    for (const std::string& file : files) {
      const std::string src = checked(dir, file, fmt::format(" (request '{}' in {})", clip_text(id), log));
      add(src, file, fmt::format("{} (request '{}')", (fs::path(dir) / file).string(), clip_text(id)));
    }
  }

  void add(const std::string& src, const std::string& dst, const std::string& what) {
    auto [it, fresh] = taken_.emplace(dst, src);
    if (fresh) {
      places_.emplace_back(src, dst);
    } else if (it->second != src) {
      throw ConfigError(fmt::format("merge-results: {} and {} would both become {}", what, it->second,
                                    (fs::path(out_dir_) / dst).string()),
                        true);
    }
  }

  static std::string checked(const std::string& dir, const std::string& file, const std::string& what) {
    std::string real;
    const std::string why = output_file_problem(dir, file, &real);
    if (!why.empty()) {
      throw ConfigError(fmt::format("merge-results: {}{}: {}; nothing was merged", (fs::path(dir) / file).string(),
                                    what, why),
                        true);
    }
    return real;
  }

  const std::string out_dir_;
  std::vector<std::pair<std::string, std::string>> places_;  // resolved source, place in --out
  std::map<std::string, std::string> taken_;                 // place -> resolved source
  std::map<std::string, std::string> stores_;                // resolved store file -> place
};

}  // namespace

MergeSummary merge_results(const std::vector<std::string>& chunk_dirs, const std::string& out_dir,
                           const MergeOptions& options) {
  if (chunk_dirs.empty()) throw ConfigError("merge-results: name at least one chunk folder", true);
  const std::vector<fs::path> chunks = resolve_chunks(chunk_dirs);
  const fs::path out = real_path(out_dir);
  check_out(out_dir, out, chunk_dirs, chunks);
  MergeSummary s;
  check_array(chunk_dirs, options, s);

  std::vector<std::unique_ptr<OutputLock>> locks;  // held until the merge is done
  const std::map<std::string, Origin> merged = read_chunks(chunk_dirs, locks, s);

  MergePlan plan(out_dir);
  plan.add_store_files(chunk_dirs);
  const std::string lines = plan.add_records(merged, s);

  for (const auto& [src, dst] : plan.places()) check_place(out, src, dst);

  // 4. All or nothing into --out (locked against runs and other merges).
  Staging staging(out);
  for (const auto& [src, dst] : plan.places()) staging.stage(src, dst);
  nlohmann::json marker = {{"merged_by", "tprun merge-results"}, {"chunks", nlohmann::json::array()}};
  for (const auto& c : chunks) marker["chunks"].push_back(c.string());
  staging.commit(lines, marker.dump() + "\n");
  s.files = static_cast<int64_t>(plan.places().size());
  return s;
}

}  // namespace tprun::jobs
