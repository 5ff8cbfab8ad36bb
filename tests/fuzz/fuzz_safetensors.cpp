// libFuzzer target: the strict safetensors header parser over a whole file in
// memory. A tprun::CheckpointError naming the file is the only acceptable
// failure; any other exception, a sanitizer report, or an accepted header that
// breaks the promises of safetensors_header.h aborts.
//
// Built with clang++ -fsanitize=fuzzer,address,undefined from the torch-free
// sources only (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/safetensors.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_header.h"
#include "runtime/error.h"

namespace {

using namespace tprun::checkpoint;

const char* const kFile = "fuzz.safetensors";

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "INVARIANT BROKEN: %s\n", what.c_str());
  std::abort();
}

void check_accepted(const SafetensorsHeader& h, size_t size) {
  if (h.file != kFile) broken("file name");
  if (h.file_size != size) broken("file_size");
  if (h.data_start != 8 + h.header_bytes || h.data_start > size) broken("data_start");
  if (h.header_bytes > kMaxHeaderBytes) broken("header over the limit accepted");
  uint64_t total = 0;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorEntry& e = h.tensors[i];
    if (i > 0 && !(h.tensors[i - 1].name < e.name)) broken("tensors not sorted by name or not unique");
    if (h.find(e.name) != &e) broken("find('" + e.name + "')");
    if (e.name == "__metadata__") broken("__metadata__ taken for a tensor");
    if (parse_dtype(dtype_name(e.dtype)) != e.dtype) broken("dtype name round trip");
    if (e.begin > e.end || e.end > h.data_bytes()) broken("offsets of '" + e.name + "' outside the data");
    unsigned __int128 numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) broken("negative dim accepted");
      if (__builtin_mul_overflow(numel, static_cast<unsigned __int128>(d), &numel)) broken("numel wraps 128 bits");
    }
    if (numel > static_cast<unsigned __int128>(INT64_MAX)) broken("numel of '" + e.name + "' exceeds int64");
    if (static_cast<int64_t>(numel) != e.numel()) broken("numel()");
    const unsigned __int128 bits = numel * static_cast<unsigned __int128>(dtype_bits(e.dtype));
    if (bits % 8 != 0 || bits / 8 != e.nbytes()) broken("size of '" + e.name + "' does not match its shape");
    total += e.nbytes();
    (void)shape_string(e.shape);
  }
  if (total != h.data_bytes()) broken("tensor sizes do not add up to the data section (hole or overlap)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const SafetensorsHeader h = parse_safetensors_buffer(kFile, data, size);
    check_accepted(h, size);
  } catch (const tprun::Error& e) {
    const std::string msg = e.what();
    if (e.kind() != tprun::Error::Kind::Checkpoint) broken("not a CheckpointError: " + msg);
    if (msg.rfind(std::string(kFile) + ": ", 0) != 0) broken("message does not name the file: " + msg);
  }
  return 0;
}
