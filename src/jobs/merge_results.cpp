#include "jobs/merge_results.h"

#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "jobs/results_log.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

// Hard link, or copy where a link cannot be made; an existing identical target is kept.
void place(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (fs::exists(to)) {
    if (fs::equivalent(from, to, ec)) return;
    fs::remove(to);
  }
  fs::create_directories(to.parent_path());
  fs::create_hard_link(from, to, ec);
  if (ec) fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

std::string chunk_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

MergeSummary merge_results(const std::vector<std::string>& chunk_dirs, const std::string& out_dir) {
  if (chunk_dirs.empty()) throw ConfigError("merge-results: name at least one chunk folder", true);
  struct Origin {
    ResultRecord rec;
    std::string dir;
  };
  std::map<std::string, Origin> merged;
  MergeSummary s;
  for (const auto& dir : chunk_dirs) {
    if (!fs::is_regular_file(fs::path(dir) / "results.jsonl")) {
      throw ConfigError(fmt::format("merge-results: {} has no results.jsonl", dir), true);
    }
    ResultsLog log(dir);
    ++s.chunks;
    for (const auto& [id, rec] : log.records()) {
      auto it = merged.find(id);
      if (it != merged.end() && it->second.rec.status == "done" && rec.status == "done") {
        throw ConfigError(fmt::format("merge-results: request '{}' is done in both {} and {}", id, it->second.dir, dir),
                          true);
      }
      if (it == merged.end() || rec.status == "done") merged[id] = {rec, dir};
    }
  }
  const fs::path out(out_dir);
  fs::create_directories(out);
  std::map<std::string, std::string> stores;  // source store file -> name in the merged folder
  // Every finished store file of every chunk (a record's path names only one format).
  for (const auto& dir : chunk_dirs) {
    const fs::path sd = fs::path(dir) / "store";
    if (!fs::is_directory(sd)) continue;
    for (const auto& e : fs::directory_iterator(sd)) {
      const std::string n = e.path().filename().string();
      if (!e.is_regular_file() || n.empty() || n[0] == '.' || e.path().extension() != ".h5") continue;
      const std::string name = fmt::format("store/{}-{}", chunk_name(dir), n);
      stores.emplace(e.path().string(), name);
      place(e.path(), out / name);
      ++s.files;
    }
  }
  std::string lines;
  for (auto& [id, o] : merged) {
    ResultRecord r = o.rec;
    if (r.status == "done" && !r.path.empty()) {
      const std::string file = r.path.substr(0, r.path.find(':'));
      const std::string rest = r.path.substr(file.size());
      const fs::path src = fs::path(o.dir) / file;
      if (!fs::is_regular_file(src)) {
        throw ConfigError(fmt::format("merge-results: {}: request '{}' names {}, which does not exist", o.dir, id,
                                      src.string()),
                          true);
      }
      std::string dst = file;
      if (file.rfind("store/", 0) == 0) {  // store files of several chunks may share a name
        auto [it, fresh] = stores.emplace(src.string(), "");
        if (fresh) {
          it->second = fmt::format("store/{}-{}", chunk_name(o.dir), src.filename().string());
          place(src, out / it->second);
          ++s.files;
        }
        dst = it->second;
      } else {
        place(src, out / dst);
        ++s.files;
      }
      r.path = dst + rest;
    }
    (r.status == "done" ? s.done : s.failed)++;
    lines += r.to_json().dump() + "\n";
  }
  write_file_atomic((out / "results.jsonl").string(), lines);
  return s;
}

}  // namespace tprun::jobs
