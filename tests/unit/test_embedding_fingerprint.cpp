// The fingerprint of the embedding cache's folder follows the text encoders'
// and tokenizers' files and the settings (tprun's version, dtype, device
// kind, tp, sharding, memory), not the transformer's.
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
#include "jobs/embedding_fingerprint.h"
#include "jobs/manifest.h"
#include "jobs/staged_phases.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;
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

TEST(EmbeddingSettings, VersionDtypeDeviceKindTpSharding) {
  Manifest m;
  const std::string cpu = embedding_settings(m, 1, "cpu");
  EXPECT_NE(cpu.find(std::string("tprun=") + TPRUN_VERSION), std::string::npos) << cpu;
  EXPECT_NE(cpu, embedding_settings(m, 1, "cuda:0"));  // other kernels, other bytes
  EXPECT_EQ(embedding_settings(m, 1, "cuda:0"), embedding_settings(m, 1, "cuda:1"));  // the same device kind
  EXPECT_NE(cpu, embedding_settings(m, 2, "cpu"));
  Manifest bf16 = m;
  bf16.dtype = "bf16";
  EXPECT_NE(cpu, embedding_settings(bf16, 1, "cpu"));
  Manifest sharded = m;
  sharded.shard_text_encoders = true;
  EXPECT_NE(cpu, embedding_settings(sharded, 1, "cpu"));
}

}  // namespace
}  // namespace tprun::jobs
