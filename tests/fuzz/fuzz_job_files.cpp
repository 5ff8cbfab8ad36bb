// libFuzzer target: the job manifest (TOML, strict keys) and the JSONL request
// lines. Each input is parsed (1) as a whole manifest and (2) line by line as
// request lines. Only a tprun::ConfigError naming the file is an acceptable
// failure; anything else (another exception, a crash, a sanitizer report) is a
// bug. A manifest that parses must carry the invariants validation promises.
// Seeds: tests/fuzz/corpus/job_files.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "jobs/manifest.h"
#include "jobs/request_list.h"
#include "runtime/error.h"

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_job_files: %s\n", what);
  std::abort();
}

// A field a manifest or a request sets is in range; an unset one waits for the pipeline's default.
bool below(const std::optional<int64_t>& v, int64_t lo) { return v.has_value() && *v < lo; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = tprun::jobs::parse_manifest_text(text, "/fuzz/job.toml");
    if (m.tp < 1 || m.dp < 0 || m.model.empty() || m.requests.empty()) bug("manifest invariants broken");
    if (!m.png && !m.hdf5 && !m.latents && !m.mp4 && !m.frame_pngs) bug("no output format");
    if (below(m.defaults.steps, 1) || below(m.defaults.height, 1) || below(m.defaults.width, 1)) {
      bug("defaults out of range");
    }
  } catch (const tprun::ConfigError& e) {
    if (std::string(e.what()).find("job.toml") == std::string::npos) bug("manifest error without the file name");
  }
  size_t start = 0;
  int64_t line = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    ++line;
    try {
      const auto r = tprun::jobs::parse_request_line(text.substr(start, nl - start), "/fuzz/r.jsonl", line, {});
      if (r.id.empty() || below(r.gen.steps, 1) || below(r.gen.height, 1)) bug("request invariants broken");
    } catch (const tprun::ConfigError& e) {
      if (std::string(e.what()).find("r.jsonl:") == std::string::npos) bug("request error without file:line");
    }
    start = nl + 1;
  }
  return 0;
}
