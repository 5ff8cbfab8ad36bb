// libFuzzer target: the MP4 box walk (jobs/mp4_file.h) that resume,
// merge-results and the output placement rule run on files a user may have
// put in an output folder. Each input is written to a file and walked; a
// verdict is a string, so any exception, crash or sanitizer report is a bug,
// and an MP4 called whole must have a video track with samples and a size
// that fits its file. Seeds: tests/fuzz/corpus/mp4 (tprun-written MP4s, whole
// and cut).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "jobs/mp4_file.h"

namespace {

namespace fs = std::filesystem;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_mp4: %s\n", what);
  std::abort();
}

std::string input_file() {
  static const std::string path =
      (fs::temp_directory_path() / ("fuzz-mp4-" + std::to_string(::getpid()) + ".mp4")).string();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = input_file();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  tprun::jobs::Mp4Facts facts;
  const std::string why = tprun::jobs::mp4_incomplete(path, &facts);
  if (why.empty()) {
    if (facts.video_samples < 1) bug("called whole without a video sample");
    if (size < 16) bug("called whole with less than two box headers");
  }
  if (facts.comment.size() > size) bug("a comment longer than the file");
  return 0;
}
