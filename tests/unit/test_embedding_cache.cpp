// The on-disk embedding cache of staged jobs: chunks round-trip bit-exactly
// with any key bytes, a second cache on the same folder finds them, bad files
// are skipped with a warning and kept, chunk files are never replaced, and
// nothing is written outside embeddings/<fingerprint>/. The fingerprint
// follows the text encoders' and tokenizers' files and the settings, not the
// transformer's.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
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

void write_small_weights(const fs::path& path, float value) {
  const float data[4] = {value, 1, 2, 3};
  checkpoint::TensorPayload p;
  p.name = "w";
  p.shape = {4};
  p.data = data;
  fs::create_directories(path.parent_path());
  checkpoint::write_safetensors(path.string(), {p}, {}, /*overwrite=*/true);
}

// A pipeline folder with text_encoder, tokenizer and transformer components,
// and a sparse weight file over kFingerprintBytesLimit in text_encoder/.
fs::path make_pipeline(const fs::path& root) {
  const fs::path m = root / "model";
  write_text(m / "model_index.json", R"({"_class_name": "FluxPipeline", "_diffusers_version": "0.32.0",
    "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
    "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": [null, null]})");
  write_text(m / "text_encoder" / "config.json", R"({"hidden_size": 32})");
  write_small_weights(m / "text_encoder" / "model-00001-of-00002.safetensors", 0);
  const fs::path big = m / "text_encoder" / "model-00002-of-00002.safetensors";
  std::ofstream(big, std::ios::binary).put('x');
  fs::resize_file(big, kFingerprintBytesLimit + 1);  // sparse: no disk used
  write_text(m / "tokenizer" / "vocab.json", R"({"a": 0})");
  write_text(m / "tokenizer" / "merges.txt", "#version: 0.2\n");
  write_text(m / "transformer" / "config.json", R"({"num_layers": 1})");
  write_small_weights(m / "transformer" / "diffusion_pytorch_model.safetensors", 0);
  return m;
}

std::string fingerprint(const fs::path& model, const std::string& settings = "bf16 tp=1") {
  return embedding_fingerprint(model.string(), settings);
}

void bump_mtime(const fs::path& p, int seconds) {
  fs::last_write_time(p, fs::last_write_time(p) + std::chrono::seconds(seconds));
}

TEST(EmbeddingFingerprint, FollowsTextEncodersTokenizersAndSettings) {
  TempDir tmp;
  const fs::path m = make_pipeline(tmp.path());
  const std::string base = fingerprint(m);
  EXPECT_TRUE(std::regex_match(base, std::regex("[0-9a-f]{32}"))) << base;
  EXPECT_EQ(fingerprint(m), base);
  EXPECT_NE(fingerprint(m, "fp32 tp=1"), base);
  EXPECT_NE(fingerprint(m, "bf16 tp=2"), base);

  write_text(m / "text_encoder" / "config.json", R"({"hidden_size": 33})");
  const std::string config_changed = fingerprint(m);
  EXPECT_NE(config_changed, base);
  write_text(m / "text_encoder" / "config.json", R"({"hidden_size": 32})");
  EXPECT_EQ(fingerprint(m), base);

  write_small_weights(m / "text_encoder" / "model-00001-of-00002.safetensors", 0.5f);  // same size, other bytes
  EXPECT_NE(fingerprint(m), base);
  write_small_weights(m / "text_encoder" / "model-00001-of-00002.safetensors", 0);
  EXPECT_EQ(fingerprint(m), base);

  write_text(m / "tokenizer" / "merges.txt", "#version: 0.2\na b\n");
  EXPECT_NE(fingerprint(m), base);
  write_text(m / "tokenizer" / "merges.txt", "#version: 0.2\n");
  write_text(m / "tokenizer" / "special_tokens_map.json", "{}");  // a new file counts
  EXPECT_NE(fingerprint(m), base);
  fs::remove(m / "tokenizer" / "special_tokens_map.json");
  EXPECT_EQ(fingerprint(m), base);
}

TEST(EmbeddingFingerprint, LargeWeightFilesBySizeAndMtime) {
  TempDir tmp;
  const fs::path m = make_pipeline(tmp.path());
  const fs::path big = m / "text_encoder" / "model-00002-of-00002.safetensors";
  const std::string base = fingerprint(m);
  const auto mtime = fs::last_write_time(big);

  bump_mtime(big, 5);
  EXPECT_NE(fingerprint(m), base);
  fs::last_write_time(big, mtime);
  EXPECT_EQ(fingerprint(m), base);

  fs::resize_file(big, kFingerprintBytesLimit + 2);
  fs::last_write_time(big, mtime);
  EXPECT_NE(fingerprint(m), base);
  fs::resize_file(big, kFingerprintBytesLimit + 1);
  fs::last_write_time(big, mtime);
  EXPECT_EQ(fingerprint(m), base);

  {  // same size and mtime, other bytes: a large file's bytes are not read
    std::fstream f(big, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('y');
  }
  fs::last_write_time(big, mtime);
  EXPECT_EQ(fingerprint(m), base);
}

TEST(EmbeddingFingerprint, IgnoresTheTransformerCountsEveryTextEncoder) {
  TempDir tmp;
  const fs::path m = make_pipeline(tmp.path());
  const std::string base = fingerprint(m);
  write_text(m / "transformer" / "config.json", R"({"num_layers": 2})");
  write_small_weights(m / "transformer" / "diffusion_pytorch_model.safetensors", 7);
  write_text(m / "transformer" / "extra.json", "{}");
  EXPECT_EQ(fingerprint(m), base);

  // A second encoder (text_encoder_2) and a nested tokenizer file both count.
  write_text(m / "tokenizer" / "sub" / "added_tokens.json", "{}");
  const std::string nested = fingerprint(m);
  EXPECT_NE(nested, base);
  write_text(m / "model_index.json", R"({"_class_name": "FluxPipeline", "_diffusers_version": "0.32.0",
    "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
    "text_encoder_2": ["transformers", "T5EncoderModel"],
    "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": [null, null]})");
  write_text(m / "text_encoder_2" / "config.json", R"({"d_model": 8})");
  const std::string two = fingerprint(m);
  EXPECT_NE(two, nested);
  write_text(m / "text_encoder_2" / "config.json", R"({"d_model": 9})");
  EXPECT_NE(fingerprint(m), two);
}

TEST(EmbeddingFingerprint, FollowsLinkedFilesNotOutsideFolders) {
  TempDir tmp;
  const fs::path m = make_pipeline(tmp.path());
  // A file linked from outside the model folder (a Hugging Face snapshot) is followed.
  write_text(tmp.path() / "blobs" / "abc", "tokenizer bytes");
  fs::create_symlink(tmp.path() / "blobs" / "abc", m / "tokenizer" / "tokenizer.json");
  // A folder outside the model folder is not walked; a loop back inside is walked once.
  write_text(tmp.path() / "elsewhere" / "notes.txt", "one");
  fs::create_directory_symlink(tmp.path() / "elsewhere", m / "tokenizer" / "outside");
  fs::create_directory_symlink(m / "tokenizer", m / "tokenizer" / "loop");
  const std::string base = fingerprint(m);
  write_text(tmp.path() / "blobs" / "abc", "other tokenizer bytes");
  EXPECT_NE(fingerprint(m), base);
  write_text(tmp.path() / "blobs" / "abc", "tokenizer bytes");
  EXPECT_EQ(fingerprint(m), base);
  write_text(tmp.path() / "elsewhere" / "notes.txt", "two");
  EXPECT_EQ(fingerprint(m), base);
  EXPECT_THROW(fingerprint(tmp.path() / "elsewhere"), CheckpointError);  // not a pipeline folder
}

// A folder in memory (/dev/shm) where there is one: creating 10,000 files
// there takes a fraction of a second, against seconds on an overlay /tmp.
class FastDir {
 public:
  FastDir() {
    std::error_code ec;
    const fs::path shm = "/dev/shm";
    if (fs::is_directory(shm, ec) && ::access(shm.c_str(), W_OK) == 0) {
      path_ = shm / ("tprun-test-" + std::to_string(::getpid()) + "-many");
      fs::create_directories(path_);
    } else {
      path_ = tmp_.path();
    }
  }
  ~FastDir() {
    std::error_code ec;
    if (path_ != tmp_.path()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  TempDir tmp_;
  fs::path path_;
};

TEST(EmbeddingFingerprint, RefusesAComponentFolderOfTooManyFiles) {
  FastDir dir;
  const fs::path m = make_pipeline(dir.path());
  const fs::path many = m / "tokenizer" / "many";
  fs::create_directories(many);
  // The folder "many" and its files: one entry over the bound.
  for (int64_t i = 0; i + 3 < kFingerprintMaxFiles; ++i) std::ofstream(many / std::to_string(i));
  EXPECT_NO_THROW(fingerprint(m));  // vocab.json, merges.txt, many/ and its files: exactly the bound
  std::ofstream(many / "one-more");
  try {
    fingerprint(m);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find((m / "tokenizer").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("10000"), std::string::npos) << e.what();
  }
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
      {"", {{"empty", at::randn({0, 4})}}},
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
  cache.write_chunk("c.safetensors", first);
  EXPECT_THROW(cache.write_chunk("c.safetensors", {{"b", {{"x", at::randn({3})}}}}), CheckpointError);
  EXPECT_FALSE(cache.contains("b"));
  expect_same(EmbeddingCache(tmp.path().string(), "fp1").get("a"), first[0].second);
  for (const std::string bad : {"../c2.safetensors", "sub/c2.safetensors", ".c2.safetensors", "c2.bin", "",
                                ".safetensors", "/tmp/c2.safetensors"}) {
    EXPECT_THROW(cache.write_chunk(bad, first), CheckpointError) << bad;
  }
  EXPECT_THROW(cache.write_chunk("d.safetensors", {{"k", {{"x", at::randn({1})}}}, {"k", {{"x", at::randn({1})}}}}),
               CheckpointError);  // a key twice
  EXPECT_THROW(cache.write_chunk("d.safetensors", {{"k", {}}}), CheckpointError);  // no tensors
  EXPECT_THROW(EmbeddingCache(tmp.path().string(), "../up"), CheckpointError);
  EXPECT_THROW(EmbeddingCache((tmp.path() / "missing").string(), "fp1").write_chunk("c.safetensors", first), IoError);
  EXPECT_EQ(all_files(tmp.path()),
            (std::vector<std::string>{"embeddings", "embeddings/fp1", "embeddings/fp1/c.safetensors"}));
}

TEST(EmbeddingCache, FirstIndexedFileWinsAKey) {
  TempDir tmp;
  EmbeddingCache cache(tmp.path().string(), "fp1");
  const Entries b = {{"k", {{"x", at::full_like(at::randn({2}), 2)}}}};
  const Entries a = {{"k", {{"x", at::full_like(at::randn({2}), 1)}}}, {"other", {{"x", at::randn({2})}}}};
  cache.write_chunk("b.safetensors", b);
  cache.write_chunk("a.safetensors", a);
  expect_same(cache.get("k"), b[0].second);  // indexed first in this cache
  EXPECT_TRUE(cache.contains("other"));
  EmbeddingCache reopened(tmp.path().string(), "fp1");
  expect_same(reopened.get("k"), a[0].second);  // "a.safetensors" sorts first
  EXPECT_EQ(reopened.size(), 2u);
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
    checkpoint::write_safetensors((dir / "f-keys.safetensors").string(), {p0, p1},
                                  {{"tprun_embeddings", "1"}, {"fingerprint", "fp1"}, {"keys", R"(["p","q","r"])"}});
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

}  // namespace
}  // namespace tprun::jobs
