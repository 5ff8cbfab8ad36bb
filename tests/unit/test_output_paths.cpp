// Every path tprun writes (jobs/output_folder.h check_output_path),
// the output folder's lock file (no symlink followed) and the reader's lock.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "checkpoint/tensor_file.h"
#include "jobs/manifest.h"
#include "jobs/output_folder.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

class OutputPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tprun-outpaths-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_ / "model" / "transformer");
    weights_ = write("model/transformer/w.safetensors", "weights");
    reads_ = {{"the model folder", (dir_ / "model").string()}, {"the requests file", write("r.jsonl", "{}\n")}};
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  std::string refusal(const std::string& path, OutputKind kind, const std::string& option = "--out") {
    try {
      check_output_path(path, option, reads_, kind);
    } catch (const ConfigError& e) {
      EXPECT_TRUE(e.all_ranks());
      return e.what();
    }
    return "";
  }
  fs::path dir_;
  std::string weights_;
  std::vector<ReadPath> reads_;
  static inline int counter_ = 0;
};

TEST_F(OutputPaths, NeverInsideTheModelNorOntoAnInput) {
  for (const auto& p : {weights_, (dir_ / "model" / "new.png").string(), (dir_ / "x" / ".." / "model" / "a").string(),
                        (dir_ / "model").string()}) {
    const auto e = refusal(p, OutputKind::Png);
    EXPECT_NE(e.find("--out " + p + ": is inside the model folder"), std::string::npos) << e;
  }
  EXPECT_NE(refusal(reads_[1].path, OutputKind::Status, "--status-file").find("is the requests file"),
            std::string::npos);
  fs::create_symlink(weights_, dir_ / "link.png");
  EXPECT_NE(refusal((dir_ / "link.png").string(), OutputKind::Png).find("(it resolves to " + weights_ + ")"),
            std::string::npos);
  fs::create_hard_link(weights_, dir_ / "hard.safetensors");
  EXPECT_NE(refusal((dir_ / "hard.safetensors").string(), OutputKind::Tensors).find("hard link"), std::string::npos);
  fs::create_directory_symlink(dir_ / "model", dir_ / "alias");
  EXPECT_NE(refusal((dir_ / "alias" / "x.png").string(), OutputKind::Png).find("inside the model folder"),
            std::string::npos);
  EXPECT_EQ(refusal((dir_ / "new.png").string(), OutputKind::Png), "");  // a new file elsewhere
  EXPECT_NE(refusal((dir_ / "model" / "cache").string(), OutputKind::Folder).find("inside the model"),
            std::string::npos);
  EXPECT_NE(refusal(reads_[1].path, OutputKind::Folder).find("requests file"), std::string::npos);
  EXPECT_EQ(refusal((dir_ / "cache").string(), OutputKind::Folder), "");
}

TEST_F(OutputPaths, ReplacesOnlyWhatTprunWrote) {
  const std::vector<uint8_t> rgb(4 * 4 * 3, 128);
  const std::string ours = (dir_ / "ours.png").string();
  pipelines::write_png(ours, rgb.data(), 4, 4, {{"Software", "tprun 1"}, {"prompt", "x"}});
  EXPECT_EQ(refusal(ours, OutputKind::Png), "");
  const std::string theirs = (dir_ / "theirs.png").string();
  pipelines::write_png(theirs, rgb.data(), 4, 4, {{"Software", "GIMP"}});
  EXPECT_NE(refusal(theirs, OutputKind::Png).find("exists and is not a PNG tprun wrote"), std::string::npos);
  EXPECT_NE(refusal(write("notes.txt", "x"), OutputKind::Png).find("not a complete PNG"), std::string::npos);
  EXPECT_NE(refusal((dir_ / "model").string() + "/../notes.txt", OutputKind::Status).find("not a tprun status"),
            std::string::npos);

  const std::string tensors = (dir_ / "t.safetensors").string();
  checkpoint::write_tensor_file_f32(tensors, {{"x", at::ones({2})}});
  EXPECT_EQ(refusal(tensors, OutputKind::Tensors), "");
  EXPECT_NE(refusal(ours, OutputKind::Tensors).find("not a safetensors file"), std::string::npos);

  EXPECT_EQ(refusal(write("status.json", "{\"exit_code\": 0, \"state\": \"finished\"}\n"), OutputKind::Status), "");
  EXPECT_NE(refusal(write("other.json", "{\"exit_code\": \"0\"}"), OutputKind::Status).find("not a tprun status"),
            std::string::npos);
  fs::create_symlink(dir_ / "nowhere", dir_ / "dangling");
  EXPECT_NE(refusal((dir_ / "dangling").string(), OutputKind::Status).find("leads nowhere"), std::string::npos);
  EXPECT_NE(refusal(dir_.string(), OutputKind::Png).find("is a folder"), std::string::npos);
}

TEST_F(OutputPaths, LockFileIsNeverFollowed) {
  const std::string victim = write("victim.txt", "precious\n");
  fs::create_directories(dir_ / "out");
  fs::create_symlink(victim, dir_ / "out" / kLockFileName);
  for (int shared = 0; shared < 2; ++shared) {
    std::string e;
    try {
      if (shared) OutputLock::acquire_shared((dir_ / "out").string());
      else OutputLock::acquire((dir_ / "out").string());
    } catch (const ConfigError& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("lock file " + (dir_ / "out" / kLockFileName).string() + " is a symbolic link"),
              std::string::npos)
        << e;
  }
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious\n");
  fs::remove(dir_ / "out" / kLockFileName);
  fs::create_directory(dir_ / "out" / kLockFileName);
  EXPECT_THROW(OutputLock::acquire((dir_ / "out").string()), ConfigError);
  EXPECT_THROW(OutputLock::acquire_shared((dir_ / "out").string()), ConfigError);
}

TEST_F(OutputPaths, SharedLockWaitsForNoReaderAndRefusesARunningWriter) {
  const std::string out = (dir_ / "out").string();
  fs::create_directories(out);
  auto none = OutputLock::acquire_shared(out);  // no run ever locked it: holds nothing, creates nothing
  EXPECT_FALSE(none->held());
  EXPECT_FALSE(fs::exists(dir_ / "out" / kLockFileName));
  {
    auto writer = OutputLock::acquire(out);
    ASSERT_TRUE(writer->held());
    std::string e;
    try {
      OutputLock::acquire_shared(out);
    } catch (const ConfigError& x) {
      e = x.what();
    }
    EXPECT_NE(e.find(fmt::format("output folder {} in use by pid {}", out, ::getpid())), std::string::npos) << e;
  }
  auto a = OutputLock::acquire_shared(out);
  auto b = OutputLock::acquire_shared(out);  // readers share
  EXPECT_TRUE(a->held() && b->held());
  EXPECT_THROW(OutputLock::acquire(out), ConfigError);  // a run waits for the readers
}

}  // namespace
}  // namespace tprun::jobs

namespace tprun::jobs {
namespace {

TEST_F(OutputPaths, ManifestOffloadFoldersAreResolvedAndChecked) {
  const std::string job = (dir_ / "job" / "job.toml").string();
  fs::create_directories(dir_ / "job");
  write("job/r.jsonl", "{\"id\": \"a\", \"prompt\": \"x\"}\n");
  std::ofstream(dir_ / "model" / "model_index.json") << "{}";
  const std::string head = "model = \"../model\"\nrequests = \"r.jsonl\"\n[memory]\n";
  auto manifest = [&](const std::string& memory) {
    std::ofstream(job) << head << memory;
    return job;
  };
  Manifest m = parse_manifest(manifest("offload = { type = \"block_level\", to = \"disk\", disk_path = \"cache\" }\n"));
  EXPECT_EQ(m.memory.offload.disk_path, (dir_ / "job" / "cache").string());  // the manifest's folder, not "."
  check_paths(m);
  m = parse_manifest(job, {parse_override("memory.offload.disk_path=cli-cache")});
  EXPECT_EQ(m.memory.offload.disk_path, (fs::current_path() / "cli-cache").string());  // --set: the current folder
  m = parse_manifest(manifest("offload = { type = \"block_level\", to = \"disk\", disk_path = \"../model/x\" }\n"));
  std::string e;
  try {
    check_paths(m);
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find(job + ": memory.offload.disk_path " + (dir_ / "model" / "x").string() + ": is inside the model"),
            std::string::npos)
      << e;
  try {
    parse_manifest(manifest("offload_folder = \"spill\"\n"));
    e.clear();
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("memory.offload_folder: is only used with memory.device_map"), std::string::npos) << e;
  m = parse_manifest(manifest("device_map = \"balanced\"\noffload_folder = \"spill\"\n"));
  EXPECT_EQ(m.memory.offload_folder, (dir_ / "job" / "spill").string());
}

// Issue 31: a file tprun did not write is never replaced at write time either
// (place_output_file), no symlink inside an output folder is followed, and
// temporaries never take a predictable name.
TEST_F(OutputPaths, PlacementNeverReplacesAForeignFile) {
  const std::vector<uint8_t> rgb(4 * 4 * 3, 7);
  const std::string target = (dir_ / "a.png").string();
  write_png_output(target, rgb.data(), 4, 4, 1, {{"Software", "tprun 1"}});  // new
  write_png_output(target, rgb.data(), 4, 4, 1, {{"Software", "tprun 1"}, {"x", "2"}});  // over its own
  pipelines::write_png((dir_ / "theirs.png").string(), rgb.data(), 4, 4, {{"Software", "GIMP"}});
  const std::string before = [&] {
    std::ifstream in(dir_ / "theirs.png", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  std::string e;
  try {
    write_png_output((dir_ / "theirs.png").string(), rgb.data(), 4, 4, 1, {{"Software", "tprun 1"}});
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("theirs.png exists and is not a PNG tprun wrote"), std::string::npos) << e;
  EXPECT_NE(e.find("move it away"), std::string::npos) << e;
  std::ifstream in(dir_ / "theirs.png", std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), before);
  for (const auto& f : fs::directory_iterator(dir_)) {
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();  // no temporary left
  }
  // A symlinked folder inside an output folder is refused, made or checked.
  fs::create_directories(dir_ / "out");
  fs::create_directory_symlink(dir_ / "model", dir_ / "out" / "images");
  EXPECT_THROW(make_output_folder(dir_ / "out", "images"), ConfigError);
  EXPECT_THROW(check_output_entry(dir_ / "out", "images", EntryKind::Folder), ConfigError);
  EXPECT_NO_THROW(check_output_entry(dir_ / "out", "store", EntryKind::Folder));  // absent
  EXPECT_EQ(make_output_folder(dir_ / "out", "store"), dir_ / "out" / "store");
  EXPECT_TRUE(is_output_temp(".a.png.tmp-Ab12Cd"));
  EXPECT_TRUE(is_output_temp("..a.png.tmp-Ab12Cd.tmp-XyZ789"));
  EXPECT_TRUE(is_output_temp(".run-20261205T000000Z-1.h5.tmp"));
  EXPECT_FALSE(is_output_temp(".notes.tmp.txt"));
  EXPECT_FALSE(is_output_temp(kLockFileName));
  EXPECT_FALSE(is_output_temp("a.png"));
}

// Issue 32: a result is a frame sequence; a PNG holds one image, so a result
// of several frames is refused by name before anything is written, never
// written as its first frame alone.
TEST_F(OutputPaths, PngRefusesAFrameSequence) {
  const std::vector<uint8_t> rgb(3 * 4 * 4 * 3, 7);  // 3 frames of 4 x 4
  const std::string target = (dir_ / "v.png").string();
  EXPECT_EQ(png_frames_problem(1), "");
  std::string e;
  try {
    write_png_output(target, rgb.data(), 4, 4, 3, {{"Software", "tprun 1"}});
  } catch (const RequestError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("cannot write " + target), std::string::npos) << e;
  EXPECT_NE(e.find("a PNG holds one image, and the result has 3 frames"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(fs::symlink_status(target)));
  for (const auto& f : fs::directory_iterator(dir_)) {
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();  // no temporary left
  }
  // A PNG tprun wrote stays as it was.
  write_png_output(target, rgb.data(), 4, 4, 1, {{"Software", "tprun 1"}});
  const auto size = fs::file_size(target);
  EXPECT_THROW(write_png_output(target, rgb.data(), 4, 4, 2, {{"Software", "tprun 1"}}), RequestError);
  EXPECT_EQ(fs::file_size(target), size);
  EXPECT_EQ(pipelines::read_png(target).rgb, std::vector<uint8_t>(rgb.begin(), rgb.begin() + 4 * 4 * 3));
}

}  // namespace
}  // namespace tprun::jobs
