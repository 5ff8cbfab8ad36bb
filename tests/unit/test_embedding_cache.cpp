// The on-disk embedding cache of staged jobs: chunks round-trip bit-exactly
// with any key bytes, a second cache on the same folder finds them, bad files
// are skipped with a warning and kept (the sweep moves them aside), chunk
// files are never replaced, every entry's hash is checked, and nothing is
// written outside embeddings/<fingerprint>/ (never through a symlink). The
// fingerprint: test_embedding_fingerprint.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <regex>
#include <sstream>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "checkpoint/safetensors_writer.h"
#include "jobs/embedding_cache.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;
using Entries = std::vector<std::pair<std::string, models::TensorMap>>;
using test::TempDir;

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// Captures spdlog's warnings while alive.
class WarningLog {
 public:
  WarningLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    auto logger = std::make_shared<spdlog::logger>("capture", sink);
    logger->set_level(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  }
  ~WarningLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return text_.str(); }
  size_t count(const std::string& needle) const {
    size_t n = 0;
    const std::string t = text();
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream text_;
};

std::string bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

void expect_same(const models::TensorMap& got, const models::TensorMap& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const at::Tensor& g = got.at(name);
    EXPECT_EQ(g.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(g.sizes(), t.sizes()) << name;
    EXPECT_TRUE(g.device().is_cpu()) << name;
    EXPECT_EQ(bytes_of(g), bytes_of(t)) << name;  // bit-exact
  }
}

Entries odd_entries() {
  const float nan_payload = [] {
    uint32_t bits = 0x7fc01234u;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }();
  const at::Tensor special =
      at::tensor({-0.0f, nan_payload, std::numeric_limits<float>::denorm_min(), -INFINITY, 1e-30f});
  std::string utf8_key = "512\nA \"quoted\" \\ prompt\twith ünïcödé, 漢字 and 🌄";
  std::string long_key = "512\n" + std::string(300 * 1024, 'x');
  const char raw[] = "77\n\xff\xfe bytes\0zero";
  std::string invalid_utf8(raw, sizeof(raw) - 1);  // with a NUL byte
  return {
      {utf8_key,
       {{"prompt_embeds", at::randn({1, 7, 16}).to(at::kBFloat16)},
        {"pooled_prompt_embeds", at::randn({1, 8})},
        {"t5_tokens_cut", at::scalar_tensor(5, at::kLong)}}},
      {long_key, {{"prompt_embeds", at::randn({2, 3}).to(at::kHalf)}, {"special", special}}},
      {invalid_utf8, {{"ids", at::arange(10, at::kLong).reshape({2, 5}).t()}}},  // non-contiguous
      {"", {{"one", at::randn({1, 4})}}},
  };
}

std::vector<std::string> all_files(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) out.push_back(fs::relative(e.path(), root).string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(EmbeddingCache, RoundTripAndReopen) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  fs::create_directories(out);
  EmbeddingCache cache(out.string(), "fp1");
  EXPECT_EQ(cache.folder(), (out / "embeddings" / "fp1").string());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(fs::exists(out / "embeddings"));  // nothing until the first write

  const Entries entries = odd_entries();
  cache.write_chunk("r0-c0-abc.safetensors", entries);
  cache.write_chunk("r0-c1-def.safetensors", {});  // no entries: nothing written
  EXPECT_EQ(cache.size(), entries.size());
  for (const auto& [key, tensors] : entries) {
    ASSERT_TRUE(cache.contains(key)) << clip_text(key);
    expect_same(cache.get(key), tensors);
  }
  EXPECT_FALSE(cache.contains("512\nnot there"));
  EXPECT_THROW(cache.get("512\nnot there"), CheckpointError);

  EmbeddingCache again(out.string(), "fp1");
  EXPECT_EQ(again.size(), entries.size());
  for (const auto& [key, tensors] : entries) expect_same(again.get(key), tensors);
  EXPECT_EQ(EmbeddingCache(out.string(), "fp2").size(), 0u);

  EXPECT_EQ(all_files(out), (std::vector<std::string>{"embeddings", "embeddings/fp1",
                                                      "embeddings/fp1/r0-c0-abc.safetensors"}));
}

TEST(EmbeddingCache, NeverReplacesAChunkAndRefusesBadNames) {
  TempDir tmp;
  EmbeddingCache cache(tmp.path().string(), "fp1");
  const Entries first = {{"a", {{"x", at::randn({3})}}}};
  EXPECT_EQ(cache.write_chunk("c.safetensors", first), "c.safetensors");
  // The name is taken: written under the next free one, the first file kept.
  EXPECT_EQ(cache.write_chunk("c.safetensors", {{"b", {{"x", at::randn({3})}}}}), "c-1.safetensors");
  EXPECT_TRUE(cache.contains("b"));
  fs::create_directory(fs::path(cache.folder()) / "c-2.safetensors");  // any kind of entry takes a name
  EXPECT_EQ(cache.write_chunk("c.safetensors", {{"d", {{"x", at::randn({3})}}}}), "c-3.safetensors");
  expect_same(EmbeddingCache(tmp.path().string(), "fp1").get("a"), first[0].second);
  for (const std::string bad : {"../c2.safetensors", "sub/c2.safetensors", ".c2.safetensors", "c2.bin", "",
                                ".safetensors", "/tmp/c2.safetensors"}) {
    EXPECT_THROW(cache.write_chunk(bad, first), CheckpointError) << bad;
  }
  EXPECT_THROW(cache.write_chunk("d.safetensors", {{"k", {{"x", at::randn({1})}}}, {"k", {{"x", at::randn({1})}}}}),
               CheckpointError);  // a key twice
  EXPECT_THROW(cache.write_chunk("d.safetensors", {{"k", {}}}), CheckpointError);  // no tensors
  EXPECT_THROW(cache.write_chunk("d.safetensors", {{"k", {{"x", at::randn({1, 0, 4})}}}}), CheckpointError);  // empty
  EXPECT_THROW(EmbeddingCache(tmp.path().string(), "../up"), CheckpointError);
  EXPECT_THROW(EmbeddingCache((tmp.path() / "missing").string(), "fp1").write_chunk("c.safetensors", first), IoError);
  EXPECT_EQ(all_files(tmp.path()),
            (std::vector<std::string>{"embeddings", "embeddings/fp1", "embeddings/fp1/c-1.safetensors",
                                      "embeddings/fp1/c-2.safetensors", "embeddings/fp1/c-3.safetensors",
                                      "embeddings/fp1/c.safetensors"}));
}

TEST(EmbeddingCache, AKeyInTwoFilesIsNotTrusted) {
  TempDir tmp;
  EmbeddingCache cache(tmp.path().string(), "fp1");
  const Entries b = {{"k", {{"x", at::full_like(at::randn({2}), 2)}}}};
  const Entries a = {{"k", {{"x", at::full_like(at::randn({2}), 1)}}}, {"other", {{"x", at::randn({2})}}}};
  const Entries c = {{"third", {{"x", at::randn({2})}}}};
  cache.write_chunk("b.safetensors", b);
  cache.write_chunk("a.safetensors", a);
  cache.write_chunk("c.safetensors", c);
  expect_same(cache.get("k"), b[0].second);  // indexed first in this cache
  EXPECT_TRUE(cache.contains("other"));
  WarningLog log;
  EmbeddingCache reopened(tmp.path().string(), "fp1");
  EXPECT_EQ(reopened.size(), 1u);  // neither a.safetensors nor b.safetensors
  EXPECT_TRUE(reopened.contains("third"));
  EXPECT_NE(log.text().find("is in both"), std::string::npos) << log.text();
  EXPECT_EQ(EmbeddingCache::sweep(tmp.path().string(), "fp1", {}), std::vector<std::string>{"c.safetensors"});
  EXPECT_TRUE(fs::exists(fs::path(cache.folder()) / "a.safetensors.bad-1"));
  EXPECT_TRUE(fs::exists(fs::path(cache.folder()) / "b.safetensors.bad-1"));
}

// A valid chunk written elsewhere, for corrupting copies.
fs::path chunk_of(const fs::path& dir, const std::string& fingerprint, const Entries& entries) {
  static int made = 0;
  const fs::path out = dir / std::to_string(made++);
  fs::create_directories(out);
  EmbeddingCache c(out.string(), fingerprint);
  c.write_chunk("src.safetensors", entries);
  return fs::path(c.folder()) / "src.safetensors";
}

TEST(EmbeddingCache, SkipsBadFilesWithOneWarningEach) {
  TempDir tmp;
  const Entries good = {{"good", {{"x", at::randn({4})}}}};
  const Entries other = {{"other", {{"x", at::randn({4})}}}};
  const fs::path dir = tmp.path() / "embeddings" / "fp1";
  {
    EmbeddingCache cache(tmp.path().string(), "fp1");
    cache.write_chunk("a-good.safetensors", good);
  }
  const fs::path donor = tmp.path() / "donor";
  fs::copy_file(chunk_of(donor, "fp1", other), dir / "b-torn.safetensors");
  fs::resize_file(dir / "b-torn.safetensors", fs::file_size(dir / "b-torn.safetensors") - 5);
  fs::copy_file(chunk_of(donor, "fp2", other), dir / "c-foreign.safetensors");
  write_text(dir / "d-junk.safetensors", "not a safetensors file at all");
  {  // header length over the reader's limit
    std::string huge(16, '\0');
    huge[3] = 0x10;  // 0x10000000 bytes > kMaxHeaderBytes
    write_text(dir / "e-huge.safetensors", huge);
  }
  {  // three keys, tensors for two
    const float v[2] = {1, 2};
    checkpoint::TensorPayload p0{"0/x", checkpoint::Dtype::F32, {2}, v, "", 0};
    checkpoint::TensorPayload p1{"1/x", checkpoint::Dtype::F32, {2}, v, "", 0};
    const std::string h = std::string(32, 'a');
    checkpoint::write_safetensors((dir / "f-keys.safetensors").string(), {p0, p1},
                                  {{"tprun_embeddings", "2"}, {"fingerprint", "fp1"}, {"keys", R"(["p","q","r"])"},
                                   {"hashes", "[\"" + h + "\",\"" + h + "\",\"" + h + "\"]"}});
    checkpoint::write_safetensors((dir / "g-plain.safetensors").string(), {p0}, {});  // not ours
  }
  fs::copy_file(chunk_of(donor, "fp1", other), dir / ".h-left.safetensors.tmp");  // a crashed write's leftover
  fs::copy_file(chunk_of(donor, "fp1", other), dir / ".i-hidden.safetensors");

  WarningLog log;
  EmbeddingCache cache(tmp.path().string(), "fp1");
  EXPECT_EQ(cache.size(), 1u);
  expect_same(cache.get("good"), good[0].second);
  EXPECT_FALSE(cache.contains("other"));
  for (const char* bad : {"b-torn", "c-foreign", "d-junk", "e-huge", "f-keys", "g-plain"}) {
    const std::string name = std::string(bad) + ".safetensors";
    EXPECT_EQ(log.count((dir / name).string() + " (kept on disk"), 1u) << name << "\n" << log.text();
    EXPECT_TRUE(fs::exists(dir / name)) << name;  // never deleted
  }
  EXPECT_EQ(log.text().find(".h-left"), std::string::npos) << log.text();
  EXPECT_EQ(log.text().find(".i-hidden"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("fp2"), std::string::npos) << log.text();  // names the other fingerprint
  EXPECT_TRUE(fs::exists(dir / ".h-left.safetensors.tmp"));

  // Writing still works next to the bad files and the leftover.
  cache.write_chunk("z.safetensors", other);
  expect_same(cache.get("other"), other[0].second);
}

TEST(EmbeddingCache, GetNamesAFileThatChangedOrWentAway) {
  TempDir tmp;
  EmbeddingCache cache(tmp.path().string(), "fp1");
  cache.write_chunk("c.safetensors", {{"k", {{"x", at::randn({4})}}}});
  const fs::path file = fs::path(cache.folder()) / "c.safetensors";
  fs::resize_file(file, fs::file_size(file) - 4);
  try {
    cache.get("k");
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  fs::remove(file);
  EXPECT_THROW(cache.get("k"), CheckpointError);
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Rewrites a safetensors file's header JSON through `edit`, keeping its data bytes.
void edit_header(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  edit(h);
  const std::string json = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  write_text(path, out + json + bytes.substr(8 + n));
}

// Every way a chunk can be unusable: the sweep moves each aside once, names it
// in one warning, keeps the good ones, never follows a link nor opens a FIFO.
TEST(EmbeddingCache, SweepMovesEveryBadChunkAsideOnce) {
  TempDir tmp;
  const fs::path donor = tmp.path() / "donor";
  const Entries two = {{"p", {{"x", at::randn({1, 3, 4})}}}, {"q", {{"x", at::randn({1, 3, 4})}}}};
  const Entries good = {{"good", {{"x", at::randn({1, 3, 4})}, {"n", at::scalar_tensor(2, at::kLong)}}}};
  EmbeddingCache cache(tmp.path().string(), "fp1");
  cache.write_chunk("m-good.safetensors", good);
  const fs::path dir = cache.folder();
  const auto copy = [&](const Entries& e, const std::string& name) {
    fs::copy_file(chunk_of(donor, "fp1", e), dir / name);
    return dir / name;
  };
  const Entries one_r = {{"r", {{"x", at::randn({1, 3, 4})}}}};
  const fs::path torn = copy(one_r, "a-torn.safetensors");
  fs::resize_file(torn, fs::file_size(torn) - 3);
  write_text(dir / "b-empty.safetensors", "");
  fs::create_symlink(chunk_of(donor, "fp1", {{"s", {{"x", at::randn({2})}}}}), dir / "c-link.safetensors");
  fs::create_directory(dir / "d-folder.safetensors");
  ASSERT_EQ(::mkfifo((dir / "e-fifo.safetensors").c_str(), 0644), 0);
  write_text(dir / "f-header.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"a\": oops}    ", 24));
  edit_header(copy(two, "g-swapped.safetensors"), [](nlohmann::json& h) {  // keys swapped
    auto keys = nlohmann::json::parse(h["__metadata__"]["keys"].get<std::string>());
    std::swap(keys[0], keys[1]);
    h["__metadata__"]["keys"] = keys.dump();
  });
  edit_header(copy({{"t", {{"x", at::randn({1, 3, 4})}}}}, "h-i32.safetensors"),
              [](nlohmann::json& h) { h["0/x"]["dtype"] = "I32"; });  // relabelled, same width
  {  // [1, 0, 4]: no text tokens
    checkpoint::TensorPayload p{"0/x", checkpoint::Dtype::F32, {1, 0, 4}, nullptr, "", 0};
    checkpoint::write_safetensors((dir / "i-zero.safetensors").string(), {p},
                                  {{"tprun_embeddings", "2"}, {"fingerprint", "fp1"}, {"keys", R"(["u"])"},
                                   {"hashes", "[\"" + std::string(32, '0') + "\"]"}});
  }
  {  // a data byte changed, the header intact
    const fs::path f = copy({{"v", {{"x", at::randn({1, 3, 4})}}}}, "j-bytes.safetensors");
    std::string b = read_all(f);
    b[b.size() - 1] ^= 0x40;
    write_text(f, b);
  }
  copy({{"w", {{"y", at::randn({1, 3, 4})}}}}, "k-missing.safetensors");  // no "x", which the rules need
  copy({{"z", {{"x", at::randn({1, 3, 4}).to(at::kDouble)}}}}, "l-f64.safetensors");  // not the job's dtype
  copy({{"good", {{"x", at::zeros({1, 3, 4})}, {"n", at::scalar_tensor(2, at::kLong)}}}},
       "0-same-key.safetensors");  // sorts first, same key as m-good: neither is trusted
  const Entries other = {{"other", {{"x", at::randn({1, 3, 4})}}}};
  copy(other, "n-other.safetensors");

  ChunkRules rules;
  rules.float_dtype = checkpoint::Dtype::F32;
  rules.check_entry = [](const std::string&, const std::vector<checkpoint::TensorEntry>& tensors) -> std::string {
    for (const auto& t : tensors) {
      if (t.name == "x") return "";
    }
    return "no 'x' tensor";
  };
  WarningLog log;
  const std::vector<std::string> kept = EmbeddingCache::sweep(tmp.path().string(), "fp1", rules);
  EXPECT_EQ(kept, std::vector<std::string>{"n-other.safetensors"});
  const char* bad[] = {"0-same-key", "a-torn", "b-empty", "c-link", "d-folder", "e-fifo", "f-header", "g-swapped",
                       "h-i32", "i-zero", "j-bytes", "k-missing", "l-f64", "m-good"};
  for (const char* b : bad) {
    const fs::path from = dir / (std::string(b) + ".safetensors");
    EXPECT_FALSE(fs::exists(fs::symlink_status(from))) << b;
    EXPECT_TRUE(fs::exists(fs::symlink_status(from.string() + ".bad-1"))) << b;
    EXPECT_EQ(log.count(from.string() + " cannot be used"), 1u) << b << "\n" << log.text();
  }
  EXPECT_TRUE(fs::is_symlink(dir / "c-link.safetensors.bad-1"));  // the link moved, its target untouched
  EXPECT_TRUE(fs::is_fifo(dir / "e-fifo.safetensors.bad-1"));
  EXPECT_NE(log.text().find("no elements"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("does not match its hash"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("the job computes in F32"), std::string::npos) << log.text();

  // A second sweep finds nothing to move; a new bad file with the same name goes to .bad-2.
  EXPECT_EQ(EmbeddingCache::sweep(tmp.path().string(), "fp1", rules), kept);
  write_text(dir / "b-empty.safetensors", "");
  EmbeddingCache::sweep(tmp.path().string(), "fp1", rules);
  EXPECT_TRUE(fs::exists(dir / "b-empty.safetensors.bad-2"));

  // Every rank then indexes exactly what the sweeper kept.
  EmbeddingCache indexed(tmp.path().string(), "fp1", rules, kept);
  EXPECT_EQ(indexed.size(), 1u);
  expect_same(indexed.get("other"), other[0].second);
  EXPECT_THROW(EmbeddingCache(tmp.path().string(), "fp1", rules, {"a-torn.safetensors"}), CheckpointError);
}

TEST(EmbeddingCache, GetChecksTheEntryHash) {
  TempDir tmp;
  EmbeddingCache cache(tmp.path().string(), "fp1");
  cache.write_chunk("c.safetensors", {{"k", {{"x", at::randn({4})}}}});
  const fs::path file = fs::path(cache.folder()) / "c.safetensors";
  const auto mtime = fs::last_write_time(file);
  std::string b = read_all(file);
  b[b.size() - 2] ^= 0x01;  // same size, same mtime below: only the hash sees it
  write_text(file, b);
  fs::last_write_time(file, mtime);
  try {
    cache.get("k");
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("do not match their hash"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("move it aside"), std::string::npos) << e.what();
  }
}

TEST(EmbeddingCache, RefusesSymlinkedFolders) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out", elsewhere = tmp.path() / "elsewhere";
  fs::create_directories(out);
  fs::create_directories(elsewhere / "fp1");
  fs::create_directory_symlink(elsewhere, out / "embeddings");
  EXPECT_THROW(EmbeddingCache(out.string(), "fp1"), ConfigError);
  EXPECT_THROW(EmbeddingCache::sweep(out.string(), "fp1", {}), ConfigError);
  fs::remove(out / "embeddings");
  fs::create_directories(out / "embeddings");
  fs::create_directory_symlink(elsewhere / "fp1", out / "embeddings" / "fp1");
  EXPECT_THROW(EmbeddingCache::check_cache_folders(out.string(), "fp1"), ConfigError);
  fs::remove(out / "embeddings" / "fp1");
  EmbeddingCache cache(out.string(), "fp1");
  fs::create_directory_symlink(elsewhere / "fp1", out / "embeddings" / "fp1");  // after the cache opened
  EXPECT_THROW(cache.write_chunk("c.safetensors", {{"k", {{"x", at::randn({4})}}}}), ConfigError);
  EXPECT_TRUE(fs::is_empty(elsewhere / "fp1"));
  fs::remove(out / "embeddings" / "fp1");
  write_text(out / "embeddings" / "fp1", "a file");
  EXPECT_THROW(EmbeddingCache::sweep(out.string(), "fp1", {}), ConfigError);
}

}  // namespace
}  // namespace tprun::jobs
