// libFuzzer target: strict JSON and the sharded-index checks of the diffusers
// layout. Each input is (1) parsed by parse_strict_json and (2) written as the
// index of a fixed component folder whose two shards hold tensors a, b
// (00001) and c (00002), which ComponentCheckpoint::open then validates.
// Only a tprun::CheckpointError naming the file is an acceptable failure; an
// index that opens must map exactly a, b -> 00001 and c -> 00002.
//
// The folder is made once per process under $TMPDIR and removed at exit.
// Seeds: tests/fuzz/corpus/json_index (tests/fuzz/make_hostile.py writes
// them; keep its FUZZ_SHARDS in step with kShards below).
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

#include "checkpoint/component_checkpoint.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace {

namespace fs = std::filesystem;
using namespace tprun::checkpoint;

const char* const kShard1 = "diffusion_pytorch_model-00001-of-00002.safetensors";
const char* const kShard2 = "diffusion_pytorch_model-00002-of-00002.safetensors";
const char* const kIndex = "diffusion_pytorch_model.safetensors.index.json";

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "INVARIANT BROKEN: %s\n", what.c_str());
  std::abort();
}

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) broken("cannot write " + path.string());
}

// A safetensors file of F32 [1] tensors, written by hand (no writer under test).
std::string shard(const std::vector<std::string>& names) {
  std::string header = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    header += (i ? "," : "") + ("\"" + names[i] + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[") +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(4 * names.size(), '\0');
}

std::string g_dir;

void remove_dir() {
  std::error_code ec;
  if (!g_dir.empty()) fs::remove_all(g_dir, ec);
}

const std::string& folder() {
  if (g_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "tprun-fuzz-index-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) broken("mkdtemp failed");
    g_dir = tmpl;
    std::atexit(remove_dir);
    write(fs::path(g_dir) / "config.json", "{\"_class_name\": \"Fuzz\"}");
    write(fs::path(g_dir) / kShard1, shard({"a", "b"}));
    write(fs::path(g_dir) / kShard2, shard({"c"}));
  }
  return g_dir;
}

void check_error(const tprun::Error& e, const std::string& file) {
  const std::string msg = e.what();
  if (e.kind() != tprun::Error::Kind::Checkpoint) broken("not a CheckpointError: " + msg);
  if (msg.rfind(file + ": ", 0) != 0 && msg.rfind(folder() + "/", 0) != 0)
    broken("message does not name the file: " + msg);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // (1) strict JSON on its own.
  try {
    (void)tprun::parse_strict_json(std::string_view(text), "fuzz.json", "the fuzz input");
  } catch (const tprun::Error& e) {
    check_error(e, "fuzz.json");
  }
  // (2) the same bytes as the index of a sharded component.
  const fs::path dir = folder();
  const std::string index = (dir / kIndex).string();
  write(index, text);
  try {
    const ComponentCheckpoint ck = ComponentCheckpoint::open(dir.string());
    const std::map<std::string, std::string> expected = {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}};
    if (ck.index_path() != index) broken("index_path");
    if (ck.files().size() != 2) broken("an accepted index must reference both shards");
    if (ck.tensor_names().size() != expected.size()) broken("accepted index with the wrong tensors");
    for (const auto& [name, file] : expected) {
      const TensorLocation loc = ck.locate(name);
      if (loc.entry == nullptr || loc.entry->name != name) broken("locate('" + name + "')");
      if (fs::path(ck.files().at(loc.file).file).filename().string() != file) broken("'" + name + "' in the wrong shard");
    }
  } catch (const tprun::Error& e) {
    check_error(e, index);
  }
  return 0;
}
