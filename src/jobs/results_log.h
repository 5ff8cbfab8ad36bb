#pragma once
// results.jsonl: one JSON line per finished request, appended and flushed to
// disk (fdatasync) per request by one writer (world rank 0):
//   {"id", "status": "done"|"failed", "path", "seed", "height", "width",
//    "steps", "timings": {"encode_s", "denoise_s", "decode_s", "total_s"},
//    "replica", "error"}
// On resume the log is read back. Only a torn last line (no final newline: a
// writer killed mid-line) is dropped; any other line that is no record is a
// ConfigError naming the file and line, and the file stays as it was. The log
// is then rewritten (temp + rename) without the records of the ids that will
// run again, so no id is ever recorded `done` twice. A failed append (disk
// full, ...) cuts the file back to its last complete line and raises IoError
// naming the path and the errno text.

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace tprun::jobs {

struct ResultRecord {
  std::string id;
  std::string status;  // "done" | "failed"
  std::string path;    // image path relative to the output dir ("" when none)
  uint64_t seed = 0;
  int64_t height = 0, width = 0, steps = 0;
  double encode_s = 0, denoise_s = 0, decode_s = 0;
  int replica = 0;
  std::string error;  // failed: the message

  nlohmann::json to_json() const;
  static ResultRecord from_json(const nlohmann::json& j);
};

class ResultsLog {
 public:
  // Reads <dir>/results.jsonl if present (latest record per id wins).
  explicit ResultsLog(std::string dir);
  ~ResultsLog();
  ResultsLog(const ResultsLog&) = delete;
  ResultsLog& operator=(const ResultsLog&) = delete;

  const std::map<std::string, ResultRecord>& records() const { return records_; }
  // 1 when the file ended in a line without newline (dropped), else 0.
  int64_t torn_lines() const { return torn_; }
  const std::string& torn_text() const { return torn_text_; }

  // Rewrites the log atomically without the records of `rerun` ids, then
  // opens it for appending.
  void begin(const std::set<std::string>& rerun);
  // Appends one line and flushes it to disk.
  void append(const ResultRecord& r);
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
  std::map<std::string, ResultRecord> records_;
  std::vector<std::string> lines_;  // intact lines, in order, for the rewrite
  std::vector<std::string> line_ids_;
  int64_t torn_ = 0;
  std::string torn_text_;
  int fd_ = -1;
};

// Writes `bytes` to `path` atomically: a temporary file in the same folder,
// fsync, rename, fsync of the folder. tprun::Error naming the path.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace tprun::jobs
