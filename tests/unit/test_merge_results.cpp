// merge-results and the results log against hostile chunks: record
// paths, --out placement, chunk locks, whole PNGs, all-or-nothing writes,
// missing array chunks; resume's reading of duplicate, foreign and
// newline-less records.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jobs/merge_results.h"
#include "jobs/output_folder.h"
#include "jobs/results_log.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

class MergeChunks : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tprun-merge-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A chunk folder as `tprun run --shard` leaves it: whole PNGs, one record each.
  std::string chunk(const std::string& name, const std::vector<std::string>& ids) {
    const fs::path d = dir_ / name;
    fs::create_directories(d / "images");
    ResultsLog log(d.string());
    log.begin({});
    for (const auto& id : ids) {
      ResultRecord r;
      r.id = id;
      r.status = "done";
      r.path = "images/" + id + ".png";
      const std::vector<uint8_t> rgb(8 * 8 * 3, static_cast<uint8_t>(id.back()));
      pipelines::write_png((d / r.path).string(), rgb.data(), 8, 8, {{"id", id}});
      log.append(r);
    }
    return d.string();
  }
  // Rewrites the record of `id` in `chunk`'s log to name `path`.
  static void set_path(const std::string& chunk, const std::string& id, const std::string& path) {
    const fs::path log = fs::path(chunk) / "results.jsonl";
    std::string text = slurp(log);
    const std::string from = "\"path\":\"images/" + id + ".png\"";
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, from.size(), "\"path\":" + nlohmann::json(path).dump());
    spit(log, text);
  }
  template <typename F>
  static std::string error_of(F fn) {
    try {
      fn();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
  static inline int counter_ = 0;
};

TEST(RecordPaths, OnlyPlainRelativePathsUnderImagesOrStore) {
  for (const char* ok : {"", "images/a.png", "images/sub/a-1_b.png", "store/run-1.h5:/images/a", "store/x.h5"}) {
    EXPECT_EQ(record_path_problem(ok), "") << ok;
  }
  for (const char* bad : {"../victim", "images/../../victim", "/etc/passwd", "images//a.png", "images/", "images",
                          "results.jsonl", "images/./a.png", "images/.a.png.tmp-1", ".tprun.lock", ":x",
                          "other/a.png", "images/a\nb.png", "store/../x.h5:/images/a"}) {
    EXPECT_NE(record_path_problem(bad), "") << bad;
  }
  EXPECT_NE(record_path_problem(std::string("images/a") + '\0' + ".png"), "");
  EXPECT_EQ(record_file("store/run-1.h5:/images/a"), "store/run-1.h5");
  EXPECT_THROW(parse_result_record(R"({"id":"a","status":"done","path":"../x"})"), std::runtime_error);
  EXPECT_THROW(parse_result_record(R"({"id":"a","status":"done","path":5})"), std::runtime_error);
  EXPECT_THROW(parse_result_record(R"([1,2])"), std::runtime_error);
  // Numbers of their type and range only (found by fuzz_results_log: a huge float cast to int64 is UB).
  EXPECT_THROW(parse_result_record(R"({"id":"a","status":"done","height":7.2e63})"), std::runtime_error);
  EXPECT_THROW(parse_result_record(R"({"id":"a","status":"done","replica":4294967296})"), std::runtime_error);
  EXPECT_THROW(parse_result_record(R"({"id":"a","status":"done","seed":-1})"), std::runtime_error);
  EXPECT_THROW(parse_result_record(R"({"id":7,"status":"done"})"), std::runtime_error);
  EXPECT_EQ(parse_result_record(R"({"id":"a","status":"done","seed":18446744073709551615})").seed, UINT64_MAX);
  EXPECT_EQ(parse_result_record(R"({"id":"a","status":"failed","error":"x"})").error, "x");
}

// Resume: an id recorded again after `done`, and a foreign path, are errors
// naming file:line; the file stays as it was.
TEST_F(MergeChunks, LogRefusesDuplicateDoneAndForeignPaths) {
  const std::string dup = "{\"id\":\"a\",\"status\":\"done\",\"path\":\"images/a.png\"}\n"
                          "{\"id\":\"b\",\"status\":\"failed\"}\n"
                          "{\"id\":\"b\",\"status\":\"done\",\"path\":\"images/b.png\"}\n"
                          "{\"id\":\"a\",\"status\":\"done\",\"path\":\"images/a.png\"}\n";
  spit(dir_ / "results.jsonl", dup);
  const auto e = error_of([&] { ResultsLog log(dir_.string()); });
  EXPECT_NE(e.find((dir_ / "results.jsonl").string() + ":4: request 'a' is recorded again after its `done` record "
                                                        "on line 1"),
            std::string::npos)
      << e;
  EXPECT_EQ(slurp(dir_ / "results.jsonl"), dup);
  spit(dir_ / "results.jsonl", "{\"id\":\"a\",\"status\":\"done\",\"path\":\"../../victim/x\"}\n");
  const auto f = error_of([&] { ResultsLog log(dir_.string()); });
  EXPECT_NE(f.find("results.jsonl:1: not a result record (request 'a': \"path\" '../../victim/x' has a '..' "
                   "component"),
            std::string::npos)
      << f;
}

// A complete last record lacking only its newline is kept; the newline goes
// in before the next record; the file is appended to, never rewritten.
TEST_F(MergeChunks, LogKeepsACompleteLastRecordWithoutNewline) {
  const std::string text = "{\"id\" : \"a\", \"status\":\"done\",\"path\":\"images/a.png\"}\n\n"
                           "{\"id\":\"b\",\"status\":\"done\",\"path\":\"images/b.png\"}";
  spit(dir_ / "results.jsonl", text);
  struct stat before {};
  ASSERT_EQ(::stat((dir_ / "results.jsonl").c_str(), &before), 0);
  {
    ResultsLog log(dir_.string());
    EXPECT_EQ(log.torn_lines(), 0);
    EXPECT_EQ(log.records().size(), 2u);
    log.begin({});
    EXPECT_EQ(slurp(dir_ / "results.jsonl"), text);  // nothing written until a record comes
    ResultRecord c;
    c.id = "c";
    c.status = "failed";
    log.append(c);
  }
  const std::string after = slurp(dir_ / "results.jsonl");
  EXPECT_EQ(after.substr(0, text.size() + 1), text + "\n");
  EXPECT_EQ(ResultsLog(dir_.string()).records().size(), 3u);
  struct stat now {};
  ASSERT_EQ(::stat((dir_ / "results.jsonl").c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, before.st_ino);
  // A torn tail (not a whole JSON value) is cut off in place, the lines before it as they were.
  spit(dir_ / "results.jsonl", after + "{\"id\":\"d\",\"sta");
  {
    ResultsLog log(dir_.string());
    EXPECT_EQ(log.torn_lines(), 1);
    log.begin({});
  }
  EXPECT_EQ(slurp(dir_ / "results.jsonl"), after);
  // A whole JSON value that is no record, last and without newline, is refused like any line.
  spit(dir_ / "results.jsonl", after + "{\"id\":\"d\",\"status\":\"maybe\"}");
  EXPECT_NE(error_of([&] { ResultsLog log(dir_.string()); }).find("results.jsonl:5: not a result record"),
            std::string::npos);
}

TEST_F(MergeChunks, PngCheckVerifiesEveryCrc) {
  const std::vector<uint8_t> rgb(16 * 8 * 3, 7);
  const fs::path png = dir_ / "a.png";
  pipelines::write_png(png.string(), rgb.data(), 16, 8, {{"prompt", "a fox"}});
  ASSERT_EQ(pipelines::png_incomplete(png.string()), "");
  std::string bytes = slurp(png);
  const auto idat = bytes.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  bytes[idat + 6] = static_cast<char>(bytes[idat + 6] ^ 0x55);
  spit(png, bytes);
  EXPECT_NE(pipelines::png_incomplete(png.string()).find("chunk 'IDAT' at byte"), std::string::npos)
      << pipelines::png_incomplete(png.string());
  EXPECT_NE(pipelines::png_incomplete(png.string()).find("bad CRC"), std::string::npos);
  fs::create_directories(dir_ / "b.png");
  EXPECT_EQ(pipelines::png_incomplete((dir_ / "b.png").string()), "a folder, not a file");
}

TEST_F(MergeChunks, RecordPathsAndSymlinksStayInsideTheChunk) {
  const auto a = chunk("shard-0-of-2", {"p0", "p2"});
  const auto b = chunk("shard-1-of-2", {"p1", "p3"});
  fs::create_directories(dir_ / "victim");
  spit(dir_ / "victim" / "x", "precious");
  const std::string good = slurp(fs::path(a) / "results.jsonl");
  set_path(a, "p0", "../victim/x");
  const auto e = error_of([&] { merge_results({a, b}, (dir_ / "m" / "merged").string()); });
  EXPECT_NE(e.find(a + "/results.jsonl:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("'p0'"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir_ / "m"));
  EXPECT_EQ(slurp(dir_ / "victim" / "x"), "precious");
  spit(fs::path(a) / "results.jsonl", good);
  // images/p2.png a symlink to a whole PNG outside the chunk.
  fs::copy_file(fs::path(b) / "images" / "p1.png", dir_ / "outside.png");
  fs::remove(fs::path(a) / "images" / "p2.png");
  fs::create_symlink(dir_ / "outside.png", fs::path(a) / "images" / "p2.png");
  const auto f = error_of([&] { merge_results({a, b}, (dir_ / "merged").string()); });
  EXPECT_NE(f.find(a + "/images/p2.png (request 'p2' in " + a + "/results.jsonl): leads outside"), std::string::npos)
      << f;
  EXPECT_FALSE(fs::exists(dir_ / "merged"));
  EXPECT_NE(output_file_problem(a, "images/p2.png"), "");
  // A symlink that stays inside the chunk is fine.
  fs::remove(fs::path(a) / "images" / "p2.png");
  fs::create_symlink("p0.png", fs::path(a) / "images" / "p2.png");
  EXPECT_EQ(output_file_problem(a, "images/p2.png"), "");
}

TEST_F(MergeChunks, OutIsNoChunkAndHoldsNoForeignLog) {
  const auto a = chunk("out/shard-0-of-2", {"p0"});
  const auto b = chunk("out/shard-1-of-2", {"p1"});
  const std::string before = slurp(fs::path(a) / "results.jsonl");
  EXPECT_NE(error_of([&] { merge_results({a, b}, a); }).find("--out " + a + " is the chunk folder"), std::string::npos);
  EXPECT_NE(error_of([&] { merge_results({a, b}, a + "/x/.."); }).find("is the chunk folder"), std::string::npos);
  EXPECT_NE(error_of([&] { merge_results({a, b}, a + "/merged"); }).find("is inside the chunk folder"),
            std::string::npos);
  EXPECT_NE(error_of([&] { merge_results({b}, a); }).find("holds a results.jsonl that merge-results did not write"),
            std::string::npos);
  EXPECT_NE(error_of([&] { merge_results({a, a}, (dir_ / "m").string()); }).find("is named twice"), std::string::npos);
  EXPECT_EQ(slurp(fs::path(a) / "results.jsonl"), before);
  EXPECT_FALSE(fs::exists(fs::path(a) / "merged"));
  // The folder holding the chunks, and a second merge into it (it is merge-results' own now), which
  // also clears what a killed merge left.
  for (int i = 0; i < 2; ++i) {
    if (i == 1) spit(dir_ / "out" / "images" / ".p0.png.tmp-merge-999999", "left by a killed merge");
    const auto s = merge_results({a, b}, (dir_ / "out").string());
    EXPECT_EQ(s.done, 2);
    EXPECT_EQ(ResultsLog((dir_ / "out").string()).records().size(), 2u);
    EXPECT_EQ(pipelines::png_incomplete((dir_ / "out" / "images" / "p1.png").string()), "");
  }
  EXPECT_EQ(slurp(fs::path(a) / "results.jsonl"), before);
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "out")) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(MergeChunks, ARunningChunkIsRefused) {
  const auto a = chunk("shard-0-of-2", {"p0"});
  const auto b = chunk("shard-1-of-2", {"p1"});
  {
    auto run = OutputLock::acquire(b);  // what `tprun run` holds while it writes the chunk
    const auto e = error_of([&] { merge_results({a, b}, (dir_ / "merged").string()); });
    EXPECT_NE(e.find("merge-results: chunk " + b + ": output folder " + b + " in use by pid"), std::string::npos)
        << e;
    EXPECT_FALSE(fs::exists(dir_ / "merged"));
  }
  EXPECT_EQ(merge_results({a, b}, (dir_ / "merged").string()).done, 2);
}

TEST_F(MergeChunks, AFailedMergeLeavesOutAsItWas) {
  const auto a = chunk("shard-0-of-2", {"p0", "p2"});
  const auto b = chunk("shard-1-of-2", {"p1", "p3"});
  fs::create_directories(dir_ / "old" / "images");
  spit(dir_ / "old" / "images" / "p0.png", "an earlier p0");
  spit(dir_ / "old" / "images" / "p2.png", "an earlier p2");
  fs::remove(fs::path(b) / "images" / "p3.png");  // p0, p1, p2 come first
  for (const auto& out : {dir_ / "new" / "merged", dir_ / "old"}) {
    const auto e = error_of([&] { merge_results({a, b}, out.string()); });
    EXPECT_NE(e.find(b + "/images/p3.png (request 'p3' in " + b + "/results.jsonl): does not exist"),
              std::string::npos)
        << e;
  }
  EXPECT_FALSE(fs::exists(dir_ / "new"));
  EXPECT_EQ(slurp(dir_ / "old" / "images" / "p0.png"), "an earlier p0");
  EXPECT_EQ(slurp(dir_ / "old" / "images" / "p2.png"), "an earlier p2");
  std::vector<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "old")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"images", "p0.png", "p2.png"}));  // every check comes first
}

TEST_F(MergeChunks, AMissingChunkOfAnArrayIsNamed) {
  const auto a = chunk("shard-0-of-3", {"p0"});
  const auto c = chunk("shard-2-of-3", {"p2"});
  const auto e = error_of([&] { merge_results({a, c}, (dir_ / "merged").string()); });
  EXPECT_NE(e.find("1 of the 3 chunks of the array are not given: shard-1-of-3; name every chunk folder, or pass "
                   "--partial"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(dir_ / "merged"));
  MergeOptions partial;
  partial.partial = true;
  const auto s = merge_results({a, c}, (dir_ / "merged").string(), partial);
  EXPECT_EQ(s.done, 2);
  EXPECT_EQ(s.missing_chunks, (std::vector<std::string>{"shard-1-of-3"}));
  const auto d = chunk("shard-1-of-2", {"p1"});
  EXPECT_NE(error_of([&] { merge_results({a, d}, (dir_ / "m2").string(), partial); }).find("different splits"),
            std::string::npos);
  // A huge N is named without listing every chunk.
  const auto big = chunk("shard-0-of-999999999", {"q"});
  EXPECT_NE(error_of([&] { merge_results({big}, (dir_ / "m3").string()); }).find("and 999999990 more"),
            std::string::npos);
}

}  // namespace
}  // namespace tprun::jobs
