#pragma once
// results.jsonl: one JSON line per finished request, appended and flushed to
// disk (fdatasync) per request by one writer (world rank 0):
//   {"id", "status": "done"|"failed", "path", "seed", "height", "width",
//    "steps", "timings": {"encode_s", "denoise_s", "decode_s", "total_s"},
//    "replica", "error"}, and "frames" (F) and "fps" where a result is a frame
//   sequence (F > 1; an image's line has neither, so it reads as 1 frame),
//   and "loras" where the request ran with LoRA adapters (a line without
//   adapters is what it always was): [{"path" (as the user wrote it),
//   "resolved" (the canonical file), "scale", "xxh3" (XXH3-128 of the file's
//   bytes, 32 hex digits)}, ...] in the order they were summed
// On resume the log is read back. Only a torn last line (no final newline and
// not a whole JSON value: a writer killed mid-line) is dropped; a complete
// record that lacks only its newline (an editor that strips it) is kept, and
// the newline goes in before the next append. Any other line that is no
// record, a record whose path is not a plain relative path inside the output
// folder (record_path_problem), and an id recorded again after a `done`
// record are a ConfigError naming the file and line, and the file stays as it
// was. The log is rewritten (temp + rename) only to remove the records of ids
// that will run again, so no id is ever recorded `done` twice; otherwise it is
// only appended to (a torn last line is cut off in place). A failed append
// (disk full, ...) cuts the file back to its last complete line and raises
// IoError naming the path and the errno text. The log is never reached
// through a symlink (output_folder.h check_output_entry: a ConfigError naming
// it) and must be a regular file; write_file_atomic's temporary gets a fresh
// name (O_EXCL), never one a planted symlink could redirect.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tprun::jobs {

// One adapter of a request, as its record names it (jobs/lora_records.h makes them).
struct LoraRecord {
  std::string path;      // as the user wrote it (a manifest's [[loras]] or the request's "loras")
  std::string resolved;  // the file it resolved to (canonical)
  double scale = 1.0;
  std::string xxh3;  // XXH3-128 of the file's bytes, 32 lowercase hex digits
  bool operator==(const LoraRecord& o) const {
    return path == o.path && resolved == o.resolved && scale == o.scale && xxh3 == o.xxh3;
  }
};

struct ResultRecord {
  std::string id;
  std::string status;  // "done" | "failed"
  std::string path;    // image path relative to the output dir ("" when none)
  uint64_t seed = 0;
  int64_t height = 0, width = 0, steps = 0;
  int64_t frames = 1;  // F of the result; written only where it is not 1
  int64_t fps = 0;     // a video's frames per second; written only where frames is not 1 (0: unknown)
  double encode_s = 0, denoise_s = 0, decode_s = 0;
  int replica = 0;
  std::string error;  // failed: the message
  std::vector<LoraRecord> loras;  // the adapters it ran with (none: left out of the line)

  nlohmann::json to_json() const;
  static ResultRecord from_json(const nlohmann::json& j);
};

// Why a record's "path" is not a plain relative path inside an output folder
// ("" when it is, and for ""): its file part (before the first ':'; a store
// path goes on with ":/images/<id>") is relative, under images/, videos/ or store/,
// images/, store/ or videos/, with no empty component and none that starts
// with '.' (so no "." or ".."),
// no control character, at most 4096 bytes. Checks the text only: symlinks
// are the caller's (merge_results.h: output_file_problem). Torch-free, no I/O.
std::string record_path_problem(const std::string& path);
// The file part of a record's path: "store/run-1.h5:/images/a" -> "store/run-1.h5".
std::string record_file(const std::string& path);

// One results.jsonl line as a checked record: a JSON object with a non-empty
// string "id", "status" done or failed, and a path record_path_problem
// accepts. std::runtime_error saying why not (the caller adds file:line).
ResultRecord parse_result_record(const std::string& line);

class ResultsLog {
 public:
  // Reads <dir>/results.jsonl if present (latest record per id wins).
  explicit ResultsLog(std::string dir);
  ~ResultsLog();
  ResultsLog(const ResultsLog&) = delete;
  ResultsLog& operator=(const ResultsLog&) = delete;

  const std::map<std::string, ResultRecord>& records() const { return records_; }
  // 1 when the file ended in a torn line (no newline, not a whole JSON
  // value: dropped), else 0.
  int64_t torn_lines() const { return torn_; }
  const std::string& torn_text() const { return torn_text_; }

  // Removes the records of `rerun` ids (an atomic rewrite, only when the log
  // holds some), cuts a torn last line off in place, then opens the log for
  // appending. A log with nothing to remove is not written.
  void begin(const std::set<std::string>& rerun);
  // Appends one line and flushes it to disk (after the newline the last
  // record lacked, if it did).
  void append(const ResultRecord& r);
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
  std::map<std::string, ResultRecord> records_;
  std::vector<std::string> lines_;  // intact lines, in order, for the rewrite
  std::vector<std::string> line_ids_;
  int64_t torn_ = 0;
  std::string torn_text_;
  int64_t intact_bytes_ = 0;    // the file up to the end of its last kept line
  bool needs_newline_ = false;  // the file ends in a kept record without its newline
  int fd_ = -1;
};

// Writes `bytes` to `path` atomically: a temporary file in the same folder,
// fsync, rename, fsync of the folder. tprun::Error naming the path.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace tprun::jobs
