// The strict safetensors reader and the diffusers component layout.
//
// Hostile files are written here, into a temporary folder, byte by byte (the
// writer under test would never produce them); each must be refused with a
// CheckpointError that names the file and, where there is one, the tensor.
// tests/fuzz/make_hostile.py writes the same cases for the CLI script and the
// fuzz corpus. Positive cases: every dtype round-trips through
// write_safetensors, zero-element tensors, metadata, variants, and the
// reference Flux checkpoint sharded and unsharded (tests/data/flux_transformer,
// a copy of the reference set shared/ref/flux_transformer/model{,_single}).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_writer.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "test_data.h"

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path reference_dir() { return test::data_dir("flux_transformer"); }

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "tprun-safetensors-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const fs::path& path, uint64_t offset, uint64_t len) {
  std::string out(len, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return out;
  uint64_t got = 0;
  while (got < len) {
    const ssize_t r = ::pread(fd, out.data() + got, len - got, static_cast<off_t>(offset + got));
    if (r <= 0) break;
    got += static_cast<uint64_t>(r);
  }
  ::close(fd);
  EXPECT_EQ(got, len) << path;
  return out;
}

// A safetensors file from a header text: 8-byte little-endian length (the
// text's, unless `length` is given), the text, the data.
std::string st_file(const std::string& header, const std::string& data = "", int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string st_file(const json& header, const std::string& data = "") { return st_file(header.dump(), data); }

json entry(const std::string& dtype, const json& shape, const json& begin, const json& end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

std::string zeros(size_t n) { return std::string(n, '\0'); }

// Runs `fn`; it must throw a CheckpointError containing every one of `needles`.
// Returns the message ("" when the expectation failed).
std::string expect_checkpoint_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a CheckpointError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a CheckpointError, nothing was thrown";
  return "";
}

// --------------------------------------------------------------------------
// Hostile single files: each refused by read_safetensors_header,
// parse_safetensors_buffer, ComponentCheckpoint::open(file) and
// ComponentCheckpoint::open(folder holding it).

struct HostileFile {
  std::string name;
  std::string bytes;
  std::string tensor;  // "" where no tensor is involved
  std::string what;    // a phrase of the message
};

std::vector<HostileFile> hostile_files() {
  const std::string w = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string deep(200000, '[');
  const std::string deep_end(200000, ']');
  return {
      {"empty_file", "", "", "too short"},
      {"too_short", std::string("\x10\x00\x00", 3), "", "too short"},
      {"truncated_body", st_file(json{{"w", entry("F32", {2, 2}, 0, 16)}}, zeros(10)), "w",
       "file holds only 10 data bytes (truncated?)"},
      {"header_length_past_end", st_file(w, zeros(8), 4096), "", "header length 4096 runs past the end"},
      {"header_length_at_limit", st_file(w, zeros(8), 100000000), "", "runs past the end"},
      {"huge_header_length", st_file(w, zeros(8), 100000001), "", "exceeds the format's limit of 100000000"},
      {"header_length_2e63", st_file(w, zeros(8), INT64_MAX), "", "exceeds the format's limit"},
      {"header_length_zero", st_file(w, zeros(8), 0), "", "not valid JSON"},
      {"header_not_json", st_file(std::string("{this is not json")), "", "not valid JSON"},
      {"header_not_utf8", st_file(std::string("{\"\xff\xfe\":{}}")), "", "not valid JSON"},
      {"header_with_nul", st_file(std::string("{\"w\"\0:{}}", 9)), "", "not valid JSON"},
      {"json_not_object", st_file(std::string("[1,2,3]")), "", "must be a JSON object, found array"},
      {"json_string", st_file(std::string("\"w\"")), "", "must be a JSON object, found string"},
      {"duplicate_tensor",
       st_file(std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
               zeros(8)),
       "w", "has the key 'w' twice"},
      // The message names the duplicated field; see the report on naming the tensor too.
      {"duplicate_field",
       st_file(std::string(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})"), zeros(4)),
       "dtype", "has the key 'dtype' twice"},
      {"duplicate_metadata",
       st_file(std::string(R"({"__metadata__":{"a":"1","a":"2"}})")), "", "has the key 'a' twice"},
      {"overlapping_offsets",
       st_file(json{{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 4, 12)}}, zeros(12)), "b",
       "overlaps tensor 'a'"},
      {"holey_offsets", st_file(json{{"a", entry("F32", {1}, 0, 4)}, {"b", entry("F32", {1}, 8, 12)}}, zeros(12)),
       "b", "a hole in the data"},
      {"hole_at_start", st_file(json{{"w", entry("F32", {1}, 4, 8)}}, zeros(8)), "w", "a hole in the data"},
      {"reversed_offsets", st_file(json{{"w", entry("F32", {1}, 8, 4)}}, zeros(8)), "w", "end before they begin"},
      {"trailing_bytes", st_file(json{{"w", entry("F32", {1}, 0, 4)}}, zeros(6)), "",
       "2 bytes after the last tensor"},
      {"data_without_tensors", st_file(json::object(), zeros(3)), "", "3 bytes after the last tensor"},
      {"size_mismatch", st_file(json{{"w", entry("F32", {2, 2}, 0, 12)}}, zeros(12)), "w",
       "hold 12 bytes, but F32 [2, 2] needs 16"},
      {"shape_overflow", st_file(json{{"w", entry("F32", {1ull << 40, 1ull << 40, 1ull << 40}, 0, 0)}}), "w",
       "overflows"},
      // 2^61 x 2^62 x 32 bits = 2^128: wraps a 128-bit product to 0 unless bounded first.
      {"shape_wraps_128_bits", st_file(json{{"w", entry("F32", {1ull << 61, 1ull << 62}, 0, 0)}}), "w",
       "overflows"},
      {"shape_wraps_f4", st_file(json{{"w", entry("F4", {1ull << 62, 1ull << 62, 16}, 0, 0)}}), "w", "overflows"},
      {"dim_too_large", st_file(json{{"w", entry("F32", {0, UINT64_MAX}, 0, 0)}}), "w", "too large"},
      {"negative_dim", st_file(json{{"w", entry("F32", {-1, 4}, 0, 0)}}), "w", "negative value -1"},
      {"negative_offset", st_file(json{{"w", entry("F32", {1}, -4, 0)}}), "w", "negative value -4"},
      {"float_dim", st_file(json{{"w", entry("F32", {2.5}, 0, 10)}}, zeros(10)), "w", "non-negative integers"},
      {"string_dim", st_file(json{{"w", entry("F32", {"2"}, 0, 8)}}, zeros(8)), "w", "non-negative integers"},
      // 200,000 levels of nesting in a 400 kB header: no recursion may follow it.
      {"deeply_nested_shape",
       st_file(R"({"w":{"dtype":"F32","shape":[)" + deep + deep_end + R"(],"data_offsets":[0,4]}})", zeros(4)), "",
       "nests deeper than 64 levels"},
      {"deeply_nested_after_overflow",
       st_file(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776,1099511627776,)" + deep + deep_end +
               R"(],"data_offsets":[0,4]}})", zeros(4)),
       "", "nests deeper than 64 levels"},
      {"unknown_dtype", st_file(json{{"w", entry("F128", {1}, 0, 16)}}, zeros(16)), "w", "unknown dtype 'F128'"},
      {"lowercase_dtype", st_file(json{{"w", entry("f32", {1}, 0, 4)}}, zeros(4)), "w", "unknown dtype 'f32'"},
      {"sub_byte_shape", st_file(json{{"w", entry("F4", {3}, 0, 2)}}, zeros(2)), "w", "does not fill whole bytes"},
      {"metadata_not_string", st_file(json{{"__metadata__", {{"format", 1}}}, {"w", entry("F32", {1}, 0, 4)}}, zeros(4)),
       "", "__metadata__ value of 'format' must be a string"},
      {"metadata_not_object", st_file(json{{"__metadata__", "pt"}, {"w", entry("F32", {1}, 0, 4)}}, zeros(4)), "",
       "__metadata__ must be an object"},
      {"unknown_field",
       st_file(json{{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}, {"extra", 1}}}}, zeros(4)), "w",
       "unknown field 'extra'"},
      {"entry_not_object", st_file(json{{"w", 5}}), "w", "entry must be an object"},
      {"missing_dtype", st_file(json{{"w", {{"shape", {1}}, {"data_offsets", {0, 4}}}}}, zeros(4)), "w",
       "missing string field 'dtype'"},
      {"missing_shape", st_file(json{{"w", {{"dtype", "F32"}, {"data_offsets", {0, 4}}}}}, zeros(4)), "w",
       "missing array field 'shape'"},
      {"offsets_arity", st_file(json{{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}}}}, zeros(4)), "w",
       "'data_offsets' must be an array [begin, end]"},
  };
}

void PrintTo(const HostileFile& c, std::ostream* os) { *os << c.name; }

class SafetensorsHostileFile : public testing::TestWithParam<HostileFile> {};

TEST_P(SafetensorsHostileFile, IsRefusedNamingFileAndTensor) {
  const HostileFile& c = GetParam();
  ScratchDir dir;
  const fs::path file = dir / "diffusion_pytorch_model.safetensors";
  write_bytes(file, c.bytes);
  write_bytes(dir / "config.json", "{}");
  std::vector<std::string> needles = {file.string()};
  if (!c.tensor.empty()) needles.push_back("'" + c.tensor + "'");
  if (!c.what.empty()) needles.push_back(c.what);

  {
    SCOPED_TRACE("read_safetensors_header");
    expect_checkpoint_error([&] { read_safetensors_header(file.string()); }, needles);
  }
  {
    SCOPED_TRACE("ComponentCheckpoint::open(file)");
    expect_checkpoint_error([&] { ComponentCheckpoint::open(file.string()); }, needles);
  }
  {
    SCOPED_TRACE("ComponentCheckpoint::open(folder)");
    expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); }, needles);
  }
  {
    SCOPED_TRACE("parse_safetensors_buffer");
    std::vector<std::string> buffer_needles = needles;
    buffer_needles[0] = "in-memory.safetensors";
    expect_checkpoint_error(
        [&] {
          parse_safetensors_buffer("in-memory.safetensors", reinterpret_cast<const uint8_t*>(c.bytes.data()),
                                   c.bytes.size());
        },
        buffer_needles);
  }
}

INSTANTIATE_TEST_SUITE_P(Safetensors, SafetensorsHostileFile, testing::ValuesIn(hostile_files()),
                         [](const testing::TestParamInfo<HostileFile>& i) { return i.param.name; });

TEST(SafetensorsHeader, NotARegularFileOrMissing) {
  ScratchDir dir;
  fs::create_directories(dir / "sub.safetensors");
  expect_checkpoint_error([&] { read_safetensors_header((dir / "sub.safetensors").string()); },
                          {(dir / "sub.safetensors").string(), "not a regular file"});
  expect_checkpoint_error([&] { read_safetensors_header((dir / "nope.safetensors").string()); },
                          {(dir / "nope.safetensors").string(), "cannot open"});
  expect_checkpoint_error([&] { ComponentCheckpoint::open((dir / "nope").string()); },
                          {(dir / "nope").string(), "no such file or folder"});
  write_bytes(dir / "weights.txt", "hello");
  expect_checkpoint_error([&] { ComponentCheckpoint::open((dir / "weights.txt").string()); },
                          {(dir / "weights.txt").string(), "not a .safetensors file"});
}

TEST(SafetensorsHeader, StrictJsonRejectsDuplicatesAtAnyDepth) {
  EXPECT_NO_THROW(parse_strict_json(R"({"a":{"b":1},"c":{"b":2}})", "f.json", "x"));
  expect_checkpoint_error([] { parse_strict_json(R"({"a":{"b":1,"b":2}})", "f.json", "the thing"); },
                          {"f.json", "the thing has the key 'b' twice"});
  expect_checkpoint_error([] { parse_strict_json(R"([{"k":1},{"k":2,"k":3}])", "f.json", "x"); },
                          {"f.json", "'k' twice"});
  expect_checkpoint_error([] { parse_strict_json(R"({"a":1} trailing)", "f.json", "x"); },
                          {"f.json", "not valid JSON"});
  // Nesting is bounded (nothing recursive ever walks a hostile document).
  const std::string ok = std::string(64, '[') + std::string(64, ']');
  EXPECT_NO_THROW(parse_strict_json(ok, "f.json", "x"));
  expect_checkpoint_error([] { parse_strict_json(std::string(65, '[') + std::string(65, ']'), "f.json", "x"); },
                          {"f.json", "x nests deeper than 64 levels"});
}

// --------------------------------------------------------------------------
// Positive cases.

std::vector<std::string> all_names() {
  std::vector<std::string> names;
  const std::string all = all_dtype_names();
  size_t start = 0;
  while (start < all.size()) {
    size_t comma = all.find(", ", start);
    if (comma == std::string::npos) comma = all.size();
    names.push_back(all.substr(start, comma - start));
    start = comma + 2;
  }
  return names;
}

// A shape of this dtype whose size fills whole bytes.
std::vector<int64_t> whole_byte_shape(Dtype d) {
  switch (dtype_bits(d)) {
    case 4: return {2, 3};   // 3 bytes
    case 6: return {4, 1};   // 3 bytes
    default: return {3, 5};
  }
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (auto& ch : out) ch = static_cast<char>(rng() & 0xff);
  return out;
}

TEST(SafetensorsRoundTrip, EveryDtypeKeepsItsBytes) {
  const std::vector<std::string> names = all_names();
  ASSERT_EQ(names.size(), 22u) << "dtype.h lists the 22 dtype strings of safetensors 0.8";
  ScratchDir dir;
  std::vector<std::string> payloads;
  payloads.reserve(names.size());
  std::vector<TensorPayload> all;
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    auto d = parse_dtype(names[i]);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(dtype_name(*d), names[i]);
    TensorPayload p;
    p.name = "t." + names[i];
    p.dtype = *d;
    p.shape = whole_byte_shape(*d);
    payloads.push_back(random_bytes(p.nbytes(), static_cast<uint32_t>(i + 1)));
    p.data = payloads.back().data();
    all.push_back(p);
    // One file per dtype ...
    const fs::path one = dir / (names[i] + ".safetensors");
    write_safetensors(one.string(), {p});
    const SafetensorsHeader h = read_safetensors_header(one.string());
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.tensors[0].dtype, *d);
    EXPECT_EQ(h.tensors[0].shape, p.shape);
    EXPECT_EQ(h.data_start % 8, 0u) << "the writer pads the header to 8 bytes";
    EXPECT_EQ(read_bytes(one, h.data_start + h.tensors[0].begin, h.tensors[0].nbytes()), payloads.back());
  }
  // ... and all in one file, where the writer orders them by width then name.
  const fs::path many = dir / "all.safetensors";
  write_safetensors(many.string(), all, {{"format", "pt"}});
  const ComponentCheckpoint ck = ComponentCheckpoint::open(many.string());
  ASSERT_EQ(ck.tensor_names().size(), names.size());
  const SafetensorsHeader& h = ck.files().at(0);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_bytes(), ck.total_bytes());
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorLocation loc = ck.locate("t." + names[i]);
    ASSERT_NE(loc.entry, nullptr);
    EXPECT_EQ(dtype_name(loc.entry->dtype), names[i]);
    EXPECT_EQ(loc.entry->shape, whole_byte_shape(loc.entry->dtype));
    EXPECT_EQ(read_bytes(many, h.data_start + loc.entry->begin, loc.entry->nbytes()), payloads[i]) << names[i];
  }
  // Also through std::ifstream: the whole file at once, each tensor a substring.
  std::ifstream in(many, std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(whole.size(), h.file_size);
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorEntry* e = h.find("t." + names[i]);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(whole.substr(h.data_start + e->begin, e->nbytes()), payloads[i]) << names[i];
  }
}

TEST(SafetensorsRoundTrip, ZeroElementAndScalarTensors) {
  ScratchDir dir;
  const std::string four = "abcd";
  std::vector<TensorPayload> ts(5);
  ts[0] = {"empty_1d", Dtype::F32, {0}, nullptr, "", 0};
  ts[1] = {"empty_2d", Dtype::BF16, {3, 0}, nullptr, "", 0};
  ts[2] = {"empty_f4", Dtype::F4, {0, 7}, nullptr, "", 0};
  ts[3] = {"scalar", Dtype::I32, {}, four.data(), "", 0};
  ts[4] = {"zero_then_big", Dtype::U8, {0, 1ll << 40}, nullptr, "", 0};
  const fs::path file = dir / "z.safetensors";
  write_safetensors(file.string(), ts);
  const SafetensorsHeader h = read_safetensors_header(file.string());
  ASSERT_EQ(h.tensors.size(), 5u);
  EXPECT_EQ(h.data_bytes(), 4u);
  for (const char* n : {"empty_1d", "empty_2d", "empty_f4", "zero_then_big"}) {
    ASSERT_NE(h.find(n), nullptr) << n;
    EXPECT_EQ(h.find(n)->numel(), 0) << n;
    EXPECT_EQ(h.find(n)->nbytes(), 0u) << n;
  }
  ASSERT_NE(h.find("scalar"), nullptr);
  EXPECT_TRUE(h.find("scalar")->shape.empty());
  EXPECT_EQ(h.find("scalar")->numel(), 1);
  EXPECT_EQ(read_bytes(file, h.data_start + h.find("scalar")->begin, 4), four);
  // A file of nothing but zero-element tensors (and one with no tensors at all).
  write_safetensors((dir / "only_empty.safetensors").string(), {ts[0], ts[1]});
  EXPECT_EQ(read_safetensors_header((dir / "only_empty.safetensors").string()).data_bytes(), 0u);
  write_bytes(dir / "no_tensors.safetensors", st_file(std::string("{}")));
  EXPECT_TRUE(read_safetensors_header((dir / "no_tensors.safetensors").string()).tensors.empty());
  // Zero-size tensors may sit at any offset where the data is contiguous.
  write_bytes(dir / "hand.safetensors",
              st_file(json{{"a", entry("F32", {1}, 0, 4)}, {"z", entry("F32", {0}, 4, 4)},
                           {"b", entry("F32", {1}, 4, 8)}, {"y", entry("F32", {0}, 8, 8)}},
                      zeros(8)));
  EXPECT_EQ(read_safetensors_header((dir / "hand.safetensors").string()).tensors.size(), 4u);
}

TEST(SafetensorsHeader, MetadataAndReferencePadding) {
  ScratchDir dir;
  // As the reference writer lays it out: __metadata__ first, header padded with spaces.
  std::string header = json{{"__metadata__", {{"format", "pt"}, {"note", "{\"not\": \"parsed\"}"}}},
                            {"w", entry("F16", {2}, 0, 4)}}
                           .dump();
  while ((8 + header.size()) % 8 != 0) header += ' ';
  write_bytes(dir / "m.safetensors", st_file(header, "wxyz"));
  const SafetensorsHeader h = read_safetensors_header((dir / "m.safetensors").string());
  EXPECT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("note"), "{\"not\": \"parsed\"}");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.find("__metadata__"), nullptr);
  EXPECT_EQ(h.data_start, 8 + header.size());
  EXPECT_EQ(read_bytes(dir / "m.safetensors", h.data_start, 4), "wxyz");
  // An empty __metadata__ object is fine too.
  write_bytes(dir / "e.safetensors", st_file(json{{"__metadata__", json::object()}}));
  EXPECT_TRUE(read_safetensors_header((dir / "e.safetensors").string()).metadata.empty());
}

TEST(SafetensorsHeader, FileOrderDoesNotMatterOnlyContiguity) {
  // Offsets need not follow the order of the keys; tensors come back sorted by name.
  const std::string bytes =
      st_file(json{{"z", entry("U8", {1}, 0, 1)}, {"a", entry("U8", {2}, 1, 3)}, {"m", entry("U8", {1}, 3, 4)}}, "1234");
  const SafetensorsHeader h = parse_safetensors_buffer("mem", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[2].name, "z");
  EXPECT_EQ(h.find("a")->begin, 1u);
  EXPECT_EQ(h.find("nope"), nullptr);
}

// --------------------------------------------------------------------------
// The diffusers layout: variants, shards and their index.

TensorPayload f32(const std::string& name, const std::vector<float>& values) {
  TensorPayload p;
  p.name = name;
  p.dtype = Dtype::F32;
  p.shape = {static_cast<int64_t>(values.size())};
  p.data = values.data();
  return p;
}

const std::string kIndex = "diffusion_pytorch_model.safetensors.index.json";
const std::string kShard1 = "diffusion_pytorch_model-00001-of-00002.safetensors";
const std::string kShard2 = "diffusion_pytorch_model-00002-of-00002.safetensors";

// A sharded component: tensors a, b in shard 1 and c in shard 2 (unless told otherwise).
struct Sharded {
  std::vector<float> va{1, 2}, vb{3, 4, 5}, vc{6};
  void write(const fs::path& dir, const json& weight_map, const std::vector<std::string>& shard1 = {"a", "b"},
             const std::vector<std::string>& shard2 = {"c"}) {
    write_bytes(dir / "config.json", R"({"_class_name": "Test"})");
    write_bytes(dir / kIndex, json{{"metadata", {{"total_size", 24}}}, {"weight_map", weight_map}}.dump(2));
    for (const auto& [file, names] : {std::pair{kShard1, shard1}, std::pair{kShard2, shard2}}) {
      std::vector<TensorPayload> ts;
      for (const auto& n : names) ts.push_back(f32(n, n == "a" ? va : n == "b" ? vb : vc));
      if (!ts.empty()) write_safetensors((dir / file).string(), ts);
    }
  }
};

json good_map() { return {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}}; }

TEST(SafetensorsLayout, ShardedComponentOpens) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), good_map());
  const ComponentCheckpoint ck = ComponentCheckpoint::open(dir.path().string());
  EXPECT_TRUE(ck.has_config());
  EXPECT_EQ(ck.config().at("_class_name").get<std::string>(), "Test");
  EXPECT_EQ(ck.index_path(), (dir / kIndex).string());
  ASSERT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(fs::path(ck.files()[0].file).filename().string(), kShard1);
  EXPECT_EQ(ck.tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck.locate("c").file, 1u);
  EXPECT_EQ(ck.locate("b").entry->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(ck.total_bytes(), 24u);
  const auto& f = ck.files()[ck.locate("c").file];
  const std::string c = read_bytes(f.file, f.data_start + ck.locate("c").entry->begin, 4);
  EXPECT_EQ(std::memcmp(c.data(), s.vc.data(), 4), 0);
  expect_checkpoint_error([&] { ck.locate("d"); }, {dir.path().string(), "tensor 'd' is not in this checkpoint"});
  // Moving keeps the locations valid.
  ComponentCheckpoint moved = ComponentCheckpoint::open(dir.path().string());
  ComponentCheckpoint other = std::move(moved);
  EXPECT_EQ(other.locate("b").entry->name, "b");
}

TEST(SafetensorsLayout, IndexNamingAMissingShard) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), {{"a", kShard1}, {"b", kShard1}, {"c", "diffusion_pytorch_model-00003-of-00003.safetensors"}},
          {"a", "b"}, {});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / kIndex).string(), "shard 'diffusion_pytorch_model-00003-of-00003.safetensors'",
                           "tensor 'c'", "is missing"});
}

TEST(SafetensorsLayout, ShardMissingAMappedTensor) {
  ScratchDir dir;
  Sharded s;
  json map = good_map();
  map["d"] = kShard2;
  s.write(dir.path(), map);
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / kIndex).string(), "tensor 'd'", kShard2, "does not contain it"});
}

TEST(SafetensorsLayout, TensorInAShardButNotInTheWeightMap) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), {{"a", kShard1}, {"c", kShard2}});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / kIndex).string(), "tensor 'b'", kShard1, "not in the index's weight_map"});
}

TEST(SafetensorsLayout, TensorInTwoShards) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), good_map(), {"a", "b"}, {"b", "c"});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / kIndex).string(), "tensor 'b'", kShard2, "two shards"});
}

TEST(SafetensorsLayout, ShardNobodyReferences) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), {{"a", kShard1}, {"b", kShard1}});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / kIndex).string(), kShard2, "no tensor of the index refers to it"});
}

TEST(SafetensorsLayout, HostileShardIsNamed) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), good_map());
  write_bytes(dir / kShard2, st_file(json{{"c", entry("F32", {1}, 0, 4)}}, zeros(2)));
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / kShard2).string(), "tensor 'c'", "truncated"});
}

TEST(SafetensorsLayout, MalformedIndexes) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), good_map());
  const std::string index = (dir / kIndex).string();
  const auto opens_with = [&](const std::string& text, const std::vector<std::string>& needles) {
    write_bytes(dir / kIndex, text);
    std::vector<std::string> all = needles;
    all.push_back(index);
    expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); }, all);
  };
  opens_with("{\"weight_map\": {\"a\": ", {"not valid JSON"});
  opens_with("[1, 2]", {"needs a \"weight_map\" object"});
  opens_with(R"({"metadata": {}})", {"needs a \"weight_map\" object"});
  opens_with(R"({"weight_map": ["x"]})", {"needs a \"weight_map\" object"});
  opens_with(R"({"weight_map": {"a": 1}})", {"weight_map entry 'a' must name a file"});
  opens_with(json{{"weight_map", {{"a", "../" + kShard1}}}}.dump(), {"weight_map entry 'a'", "not a file of this folder"});
  opens_with(R"({"weight_map": {"a": ".."}})", {"weight_map entry 'a'", "not a file of this folder"});
  opens_with(R"({"weight_map": {"a": ""}})", {"weight_map entry 'a'", "not a file of this folder"});
  opens_with(json{{"weight_map", {{"a", "/etc/passwd"}}}}.dump(), {"not a file of this folder"});
  opens_with(fmt::format(R"({{"weight_map": {{"a": "{0}", "a": "{0}", "b": "{0}", "c": "{1}"}}}})", kShard1, kShard2),
             {"has the key 'a' twice"});
  opens_with(fmt::format(R"({{"weight_map": {{}}, "weight_map": {{"a": "{0}", "b": "{0}", "c": "{1}"}}}})", kShard1,
                         kShard2),
             {"has the key 'weight_map' twice"});
  // "." and the index itself are files of the folder, but not safetensors shards.
  write_bytes(dir / kIndex, R"({"weight_map": {"a": "."}})");
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); }, {"not a regular file"});
}

TEST(SafetensorsLayout, SeveralIndexesOrSinglesOrNone) {
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), good_map());
  write_bytes(dir / "model.safetensors.index.json", json{{"weight_map", good_map()}}.dump());
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {dir.path().string(), "several safetensors indexes"});

  ScratchDir two;
  write_safetensors((two / "diffusion_pytorch_model.safetensors").string(), {f32("a", s.va)});
  write_safetensors((two / "model.safetensors").string(), {f32("a", s.va)});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(two.path().string()); },
                          {two.path().string(), "several weight files", "model.safetensors"});

  ScratchDir none;
  write_bytes(none / "config.json", "{}");
  expect_checkpoint_error([&] { ComponentCheckpoint::open(none.path().string()); },
                          {none.path().string(), "no safetensors weights"});
  // Shards without their index are not a checkpoint either.
  write_safetensors((none / kShard1).string(), {f32("a", s.va)});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(none.path().string()); }, {"no safetensors weights"});
}

TEST(SafetensorsLayout, ConfigMustBeAnObject) {
  ScratchDir dir;
  std::vector<float> v{1};
  write_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), {f32("a", v)});
  write_bytes(dir / "config.json", "[1]");
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / "config.json").string(), "must be a JSON object"});
  write_bytes(dir / "config.json", R"({"a": 1, "a": 2})");
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / "config.json").string(), "'a' twice"});
  write_bytes(dir / "config.json", R"({"a": 1})");
  EXPECT_EQ(ComponentCheckpoint::open(dir.path().string()).config().at("a").get<int>(), 1);
  // A bare file has no config.
  EXPECT_FALSE(ComponentCheckpoint::open((dir / "diffusion_pytorch_model.safetensors").string()).has_config());
}

TEST(SafetensorsLayout, VariantSelectsItsFile) {
  ScratchDir dir;
  std::vector<float> plain{1, 2};
  const uint16_t half_bits[2] = {0x3c00, 0x4000};
  TensorPayload half;
  half.name = "a";
  half.dtype = Dtype::F16;
  half.shape = {2};
  half.data = half_bits;
  write_bytes(dir / "config.json", "{}");
  write_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), {f32("a", plain)});
  write_safetensors((dir / "diffusion_pytorch_model.fp16.safetensors").string(), {half});

  const ComponentCheckpoint p = ComponentCheckpoint::open(dir.path().string());
  ASSERT_EQ(p.files().size(), 1u);
  EXPECT_EQ(fs::path(p.files()[0].file).filename().string(), "diffusion_pytorch_model.safetensors");
  EXPECT_EQ(p.locate("a").entry->dtype, Dtype::F32);

  const ComponentCheckpoint h = ComponentCheckpoint::open(dir.path().string(), "fp16");
  ASSERT_EQ(h.files().size(), 1u);
  EXPECT_EQ(fs::path(h.files()[0].file).filename().string(), "diffusion_pytorch_model.fp16.safetensors");
  EXPECT_EQ(h.locate("a").entry->dtype, Dtype::F16);

  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string(), "bf16"); },
                          {dir.path().string(), "no safetensors weights for variant 'bf16'"});
}

TEST(SafetensorsLayout, ShardedVariantBesidePlainShards) {
  // diffusers names fp16 shards "<prefix>.fp16-0000i-of-0000N.safetensors" and
  // their index "<prefix>.safetensors.index.fp16.json"; both families may share a folder.
  ScratchDir dir;
  Sharded s;
  s.write(dir.path(), good_map());
  const std::string v1 = "diffusion_pytorch_model.fp16-00001-of-00002.safetensors";
  const std::string v2 = "diffusion_pytorch_model.fp16-00002-of-00002.safetensors";
  write_safetensors((dir / v1).string(), {f32("a", s.va)});
  write_safetensors((dir / v2).string(), {f32("b", s.vb), f32("c", s.vc)});
  write_bytes(dir / "diffusion_pytorch_model.safetensors.index.fp16.json",
              json{{"weight_map", {{"a", v1}, {"b", v2}, {"c", v2}}}}.dump());

  const ComponentCheckpoint plain = ComponentCheckpoint::open(dir.path().string());
  EXPECT_EQ(plain.index_path(), (dir / kIndex).string());
  EXPECT_EQ(fs::path(plain.files()[plain.locate("b").file].file).filename().string(), kShard1);

  const ComponentCheckpoint fp16 = ComponentCheckpoint::open(dir.path().string(), "fp16");
  EXPECT_EQ(fp16.index_path(), (dir / "diffusion_pytorch_model.safetensors.index.fp16.json").string());
  EXPECT_EQ(fs::path(fp16.files()[fp16.locate("b").file].file).filename().string(), v2);

  // An fp16 shard that the fp16 index never mentions is found too.
  write_safetensors((dir / "diffusion_pytorch_model.fp16-00003-of-00003.safetensors").string(), {f32("d", s.vc)});
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string(), "fp16"); },
                          {"diffusion_pytorch_model.fp16-00003-of-00003.safetensors", "no tensor of the index"});
}

TEST(SafetensorsLayout, PickleFilesAreRefusedWithTheConversion) {
  ScratchDir dir;
  const std::string pickle("\x80\x02}q\x00.", 6);
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".pkl"}) {
    SCOPED_TRACE(ext);
    const fs::path file = dir / (std::string("diffusion_pytorch_model") + ext);
    write_bytes(file, pickle);
    EXPECT_TRUE(is_pickle_file(file.string()));
    expect_checkpoint_error([&] { ComponentCheckpoint::open(file.string()); },
                            {file.string(), "pickle checkpoints are refused", "safetensors.torch import save_file",
                             "save_pretrained(dir, safe_serialization=True)"});
    fs::remove(file);
  }
  EXPECT_FALSE(is_pickle_file("model.safetensors"));
  EXPECT_FALSE(is_pickle_file("binary.safetensors"));
  // A folder holding only a pickle names it.
  write_bytes(dir / "config.json", "{}");
  write_bytes(dir / "diffusion_pytorch_model.bin", pickle);
  expect_checkpoint_error([&] { ComponentCheckpoint::open(dir.path().string()); },
                          {(dir / "diffusion_pytorch_model.bin").string(), "pickle checkpoints are refused",
                           "save_file"});
  // Beside a safetensors file, the pickle is ignored.
  std::vector<float> v{1};
  write_safetensors((dir / "diffusion_pytorch_model.safetensors").string(), {f32("a", v)});
  EXPECT_EQ(ComponentCheckpoint::open(dir.path().string()).tensor_names(), std::vector<std::string>{"a"});
}

// --------------------------------------------------------------------------
// The reference Flux transformer (tiny config), saved by diffusers both sharded
// (2 shards + index) and as one file.

TEST(SafetensorsReference, ShardedAndSingleHoldTheSameTensors) {
  const fs::path sharded_dir = reference_dir() / "model";
  const fs::path single_dir = reference_dir() / "model_single";
  ASSERT_TRUE(fs::exists(sharded_dir / kIndex)) << sharded_dir << " (set TPRUN_SRC to the source folder)";
  const ComponentCheckpoint sharded = ComponentCheckpoint::open(sharded_dir.string());
  const ComponentCheckpoint single = ComponentCheckpoint::open(single_dir.string());
  ASSERT_EQ(sharded.files().size(), 2u);
  ASSERT_EQ(single.files().size(), 1u);
  EXPECT_TRUE(single.index_path().empty());
  EXPECT_EQ(sharded.config().dump(), single.config().dump());
  EXPECT_EQ(sharded.config().value("_class_name", ""), "FluxTransformer2DModel");
  const std::vector<std::string> names = sharded.tensor_names();
  ASSERT_EQ(names, single.tensor_names());
  ASSERT_GT(names.size(), 20u);
  EXPECT_EQ(sharded.total_bytes(), single.total_bytes());
  // The index's total_size agrees with the shards.
  const json index = read_json_file(sharded.index_path(), "index");
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), sharded.total_bytes());
  size_t in_second = 0;
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const TensorLocation a = sharded.locate(name);
    const TensorLocation b = single.locate(name);
    EXPECT_EQ(a.entry->dtype, b.entry->dtype);
    EXPECT_EQ(a.entry->shape, b.entry->shape);
    ASSERT_EQ(a.entry->nbytes(), b.entry->nbytes());
    const SafetensorsHeader& fa = sharded.files()[a.file];
    const SafetensorsHeader& fb = single.files()[b.file];
    EXPECT_EQ(fs::path(fa.file).filename().string(), index.at("weight_map").at(name).get<std::string>());
    EXPECT_TRUE(read_bytes(fa.file, fa.data_start + a.entry->begin, a.entry->nbytes()) ==
                read_bytes(fb.file, fb.data_start + b.entry->begin, b.entry->nbytes()))
        << "bytes differ";
    in_second += a.file == 1;
  }
  EXPECT_GT(in_second, 0u);
  EXPECT_LT(in_second, names.size());
}

TEST(SafetensorsReference, RewrittenByTprunReadsBackIdentically) {
  // Copy every tensor of the single file through the writer (file-to-file copy).
  const fs::path single_dir = reference_dir() / "model_single";
  const ComponentCheckpoint src = ComponentCheckpoint::open(single_dir.string());
  const SafetensorsHeader& h = src.files().at(0);
  std::vector<TensorPayload> ts;
  for (const auto& e : h.tensors) {
    TensorPayload p;
    p.name = e.name;
    p.dtype = e.dtype;
    p.shape = e.shape;
    p.src_file = h.file;
    p.src_offset = h.data_start + e.begin;
    ts.push_back(p);
  }
  ScratchDir dir;
  const fs::path out = dir / "diffusion_pytorch_model.safetensors";
  write_safetensors(out.string(), ts, h.metadata);
  expect_checkpoint_error([&] { write_safetensors(out.string(), ts); }, {out.string(), "already exists"});
  const SafetensorsHeader r = read_safetensors_header(out.string());
  EXPECT_EQ(r.metadata, h.metadata);
  ASSERT_EQ(r.tensors.size(), h.tensors.size());
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    EXPECT_EQ(r.tensors[i].name, h.tensors[i].name);
    EXPECT_EQ(read_bytes(out, r.data_start + r.tensors[i].begin, r.tensors[i].nbytes()),
              read_bytes(h.file, h.data_start + h.tensors[i].begin, h.tensors[i].nbytes()))
        << r.tensors[i].name;
  }
}

}  // namespace
}  // namespace tprun::checkpoint
