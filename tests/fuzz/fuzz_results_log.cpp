// libFuzzer target: results.jsonl records (jobs/results_log.h) as resume and
// merge-results read them. Each input is (1) one record line through
// parse_result_record, (2) a record path through record_path_problem, and (3)
// a whole log of several lines through ResultsLog's reader (from a file). A refusal is a
// std::runtime_error (1) or a ConfigError naming the file and line (3);
// anything else (another exception, a crash, a sanitizer report) is a bug. An
// accepted path must stay inside its folder whatever the folder: relative,
// under images/, videos/ or store/, no "." / ".." / empty component. Seeds:
// tests/fuzz/corpus/results_log.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "jobs/results_log.h"
#include "runtime/error.h"

namespace {

namespace fs = std::filesystem;

[[noreturn]] void bug(const char* what, const std::string& input) {
  std::fprintf(stderr, "fuzz_results_log: %s: '%s'\n", what, input.substr(0, 300).c_str());
  std::abort();
}

// What an accepted record path promises, checked independently of the parser.
void check_accepted_path(const std::string& path) {
  if (path.empty()) return;
  const std::string file = tprun::jobs::record_file(path);
  if (file.empty() || file.front() == '/' || file.back() == '/') bug("accepted a path that is not relative", path);
  if (file.find('\0') != std::string::npos) bug("accepted a NUL", path);
  if (file.rfind("images/", 0) != 0 && file.rfind("store/", 0) != 0 && file.rfind("videos/", 0) != 0) {
    bug("accepted a path outside images/ store/ videos/", path);
  }
  for (const auto& part : fs::path(file)) {
    const std::string p = part.string();
    if (p.empty() || p[0] == '.') bug("accepted an empty, '.' or '..' component", path);
  }
  const fs::path base("/base/chunk");
  const fs::path joined = (base / file).lexically_normal();
  if (joined.string().rfind("/base/chunk/", 0) != 0) bug("an accepted path leaves its folder", path);
}

std::string log_file() {
  static const std::string dir = [] {
    std::string d = (fs::temp_directory_path() / ("fuzz-results-log-" + std::to_string(::getpid()))).string();
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // (1) one line as a record
  try {
    const auto r = tprun::jobs::parse_result_record(text);
    if (r.id.empty() || (r.status != "done" && r.status != "failed")) bug("accepted a record without id/status", text);
    check_accepted_path(r.path);
    const auto again = tprun::jobs::parse_result_record(r.to_json().dump());  // what the writer writes reads back
    if (again.id != r.id || again.status != r.status || again.path != r.path) bug("round trip changed a record", text);
  } catch (const std::runtime_error&) {
  }
  // (2) the input as a record path
  if (tprun::jobs::record_path_problem(text).empty()) check_accepted_path(text);
  // (3) the input as a whole results.jsonl (a file round trip: only inputs of several lines)
  if (text.find('\n') == std::string::npos) return 0;
  const std::string dir = log_file();
  {
    std::ofstream out(dir + "/results.jsonl", std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  try {
    tprun::jobs::ResultsLog log(dir);
    for (const auto& [id, r] : log.records()) {
      if (id != r.id) bug("a record filed under another id", text);
      check_accepted_path(r.path);
    }
    if (log.torn_lines() > 1) bug("more than one torn line", text);
  } catch (const tprun::ConfigError& e) {
    if (std::string(e.what()).find("results.jsonl:") == std::string::npos) bug("a log error without file:line", text);
  }
  return 0;
}
