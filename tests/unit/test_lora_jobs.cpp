// LoRA adapters in a job (issue 34): the manifest's [[loras]] and [lora],
// a request's "loras", the path rule (jobs/lora_paths.h), the records and
// hashes (jobs/lora_records.h, results_log.h) and the order of a replica's
// units (job_schedule.h).
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jobs/job_schedule.h"
#include "jobs/lora_paths.h"
#include "jobs/lora_records.h"
#include "jobs/manifest.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "lora/lora_choice.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

class LoraJobFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tprun-lora-jobs-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_ / "job" / "adapters");
    fs::create_directories(dir_ / "elsewhere");
    dir_ = fs::canonical(dir_);
    job_ = dir_ / "job";
    write("job/adapters/style.safetensors", "style bytes");
    write("job/adapters/subject.safetensors", "subject bytes");
    write("elsewhere/far.safetensors", "far bytes");
    write("job/prompts.jsonl", "{\"id\": \"a\", \"prompt\": \"x\"}\n");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& rel, const std::string& text) {
    std::ofstream(dir_ / rel, std::ios::binary) << text;
    return (dir_ / rel).string();
  }
  std::string manifest(const std::string& tail) {
    return write("job/job.toml", "model = \"model\"\nrequests = \"prompts.jsonl\"\n" + tail);
  }
  // The message of the ConfigError `fn` throws ("" if none).
  template <typename F>
  static std::string error_of(F fn) {
    try {
      fn();
    } catch (const ConfigError& e) {
      EXPECT_TRUE(e.all_ranks());
      return e.what();
    }
    return "";
  }
  // The manifest parsed and its adapters resolved, as the job runner does.
  Manifest resolved(const std::string& tail) {
    Manifest m = parse_manifest(manifest(tail));
    resolve_manifest_loras(m);
    return m;
  }
  // One request line read against `m` with its path rule.
  JobRequest request(const Manifest& m, const std::string& line) {
    const LoraPathRule rule(m);
    return parse_request_line(line, (job_ / "prompts.jsonl").string(), 3, m.defaults,
                              [&rule](const std::string& w, std::string& r) { return rule.resolve(w, r); });
  }
  fs::path dir_, job_;
  static inline int counter_ = 0;
};

TEST_F(LoraJobFiles, ManifestLorasBecomeTheJobSet) {
  const Manifest none = resolved("");
  EXPECT_FALSE(none.defaults.loras.has_value());  // no [[loras]]: requests run on the base model
  EXPECT_TRUE(none.lora_strict);
  EXPECT_EQ(none.lora_apply, "auto");
  EXPECT_TRUE(none.lora_dirs.empty());

  const Manifest m = resolved(
      "[lora]\nstrict = false\napply = \"runtime\"\ndirs = [\"../elsewhere\"]\n\n"
      "[[loras]]\npath = \"adapters/style.safetensors\"\nscale = 0.75\n\n"
      "[[loras]]\npath = \"./adapters/../adapters/subject.safetensors\"\n");
  ASSERT_TRUE(m.defaults.loras.has_value());
  ASSERT_EQ(m.defaults.loras->size(), 2u);
  EXPECT_EQ((*m.defaults.loras)[0].path, (job_ / "adapters" / "style.safetensors").string());
  EXPECT_EQ((*m.defaults.loras)[0].scale, 0.75);
  EXPECT_EQ((*m.defaults.loras)[1].path, (job_ / "adapters" / "subject.safetensors").string());
  EXPECT_EQ((*m.defaults.loras)[1].scale, 1.0);  // the default
  EXPECT_EQ(m.lora_written, (std::vector<std::string>{"adapters/style.safetensors",
                                                       "./adapters/../adapters/subject.safetensors"}));
  EXPECT_FALSE(m.lora_strict);
  EXPECT_EQ(m.lora_apply, "runtime");
  EXPECT_EQ(m.lora_dirs, (std::vector<std::string>{(dir_ / "elsewhere").string()}));
  // The job's set is every request's default; "loras": [] is none.
  const JobRequest plain = request(m, R"({"id": "a", "prompt": "x"})");
  EXPECT_FALSE(plain.own_loras);
  EXPECT_EQ(plain.gen.lora_set(), *m.defaults.loras);
  const JobRequest bare = request(m, R"({"id": "b", "prompt": "x", "loras": []})");
  EXPECT_TRUE(bare.own_loras);
  ASSERT_TRUE(bare.gen.loras.has_value());
  EXPECT_TRUE(bare.gen.lora_set().empty());
  // --set reaches them too (relative to the current folder there).
  const Manifest o = parse_manifest(manifest(""), {parse_override("lora.apply=fused")});
  EXPECT_EQ(o.lora_apply, "fused");
}

TEST_F(LoraJobFiles, ManifestRefusesBadLoraValues) {
  const std::string adapter = "path = \"adapters/style.safetensors\"\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[[loras]]\n" + adapter + "scale = nan\n", "job.toml:5: loras[0].scale: nan is outside [-1000, 1000]"},
      {"[[loras]]\n" + adapter + "scale = inf\n", "loras[0].scale: inf is outside"},
      {"[[loras]]\n" + adapter + "scale = -1000.5\n", "loras[0].scale: -1000.5 is outside"},
      {"[[loras]]\n" + adapter + "scale = \"1\"\n", "loras[0].scale: must be a number"},
      {"[[loras]]\n" + adapter + "weight = 1\n", "job.toml:5: loras[0].weight: unknown key"},
      {"[[loras]]\nscale = 0.5\n", "loras[0].path: required key is missing"},
      {"[[loras]]\npath = \"\"\n", "job.toml:4: loras[0].path: must name a .safetensors file"},
      {"[[loras]]\npath = 3\n", "loras[0].path: must be a string"},
      {"loras = 3\n", "job.toml:3: loras: must be an array of tables"},
      {"loras = [3]\n", "loras[0]: must be a table"},
      {"[lora]\napply = \"merged\"\n", "job.toml:4: lora.apply: 'merged' is not one of auto, fused, runtime"},
      {"[lora]\nstrict = \"yes\"\n", "lora.strict: must be true or false"},
      {"[lora]\ndirs = \"adapters\"\n", "lora.dirs: must be an array of folders"},
      {"[lora]\ndirs = [\"\"]\n", "lora.dirs: names an empty folder"},
      {"[lora]\nscale = 1\n", "lora.scale: unknown key"},
  };
  for (const auto& [tail, want] : cases) {
    const std::string e = error_of([&] { parse_manifest(manifest(tail)); });
    EXPECT_NE(e.find(want), std::string::npos) << tail << " -> " << e;
  }
  std::string many;
  for (size_t i = 0; i <= lora::kMaxLorasPerRequest; ++i) many += "[[loras]]\n" + adapter;
  EXPECT_NE(error_of([&] { parse_manifest(manifest(many)); }).find("loras: 65 adapters, more than 64"),
            std::string::npos);
}

TEST_F(LoraJobFiles, ManifestAdapterFilesAreChecked) {
  fs::create_directories(job_ / "folder.safetensors");
  ASSERT_EQ(::mkfifo((job_ / "pipe.safetensors").c_str(), 0600), 0);
  write("job/adapters/notes.txt", "x");
  fs::create_symlink(dir_ / "elsewhere" / "far.safetensors", job_ / "link.safetensors");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"missing.safetensors", "job.toml:4: loras[0].path: missing.safetensors does not exist"},
      {"folder.safetensors", "loras[0].path: folder.safetensors is a folder"},
      {"pipe.safetensors", "loras[0].path: pipe.safetensors is not a regular file (a pipe)"},
      {"adapters/notes.txt", "does not end in .safetensors"},
  };
  for (const auto& [path, want] : cases) {
    const std::string e = error_of([&] { resolved("[[loras]]\npath = \"" + path + "\"\n"); });
    EXPECT_NE(e.find(want), std::string::npos) << path << " -> " << e;
  }
  // A [[loras]] file may lie anywhere, through a symlink too: its real path is the one used.
  const Manifest m = resolved("[[loras]]\npath = \"link.safetensors\"\n");
  EXPECT_EQ((*m.defaults.loras)[0].path, (dir_ / "elsewhere" / "far.safetensors").string());
  const std::string twice = error_of([&] {
    resolved("[[loras]]\npath = \"link.safetensors\"\n[[loras]]\npath = \"../elsewhere/far.safetensors\"\n");
  });
  EXPECT_NE(twice.find("loras[1].path: ../elsewhere/far.safetensors is listed twice (also loras[0])"),
            std::string::npos)
      << twice;
  const std::string dirs = error_of([&] { resolved("[lora]\ndirs = [\"nowhere\"]\n"); });
  EXPECT_NE(dirs.find("job.toml:4: lora.dirs: " + (job_ / "nowhere").string() + " is not a folder"), std::string::npos)
      << dirs;
  // Nothing was opened for writing: the adapters are as they were.
  EXPECT_EQ(fs::file_size(dir_ / "elsewhere" / "far.safetensors"), 9u);
}

TEST_F(LoraJobFiles, RequestLorasReplaceTheJobSet) {
  const Manifest m = resolved("[[loras]]\npath = \"adapters/style.safetensors\"\n");
  const JobRequest r =
      request(m, R"({"id": "a", "prompt": "x", "loras": [{"path": "adapters/subject.safetensors", "scale": -0.5},)"
                 R"( {"path": "adapters/style.safetensors"}]})");
  ASSERT_EQ(r.gen.lora_set().size(), 2u);
  EXPECT_EQ(r.gen.lora_set()[0].path, (job_ / "adapters" / "subject.safetensors").string());
  EXPECT_EQ(r.gen.lora_set()[0].scale, -0.5);
  EXPECT_EQ(r.gen.lora_set()[1].scale, 1.0);
  EXPECT_EQ(r.lora_written,
            (std::vector<std::string>{"adapters/subject.safetensors", "adapters/style.safetensors"}));
  // Without a rule (the fuzz target, `tprun plan`) the paths stay as written.
  const JobRequest plain = parse_request_line(R"({"id": "a", "prompt": "x", "loras": [{"path": "q.safetensors"}]})",
                                              "r.jsonl", 1, {});
  EXPECT_EQ(plain.gen.lora_set()[0].path, "q.safetensors");
}

TEST_F(LoraJobFiles, RequestRefusesBadLoras) {
  const Manifest m = resolved("");
  const std::string file = (job_ / "prompts.jsonl").string();
  std::string many = "[";
  for (size_t i = 0; i <= lora::kMaxLorasPerRequest; ++i) {
    many += fmt::format("{}{{\"path\": \"adapters/style.safetensors\"}}", i ? ", " : "");
  }
  many += "]";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("loras": {"path": "a.safetensors"})", ":3: loras: must be an array"},
      {R"("loras": "adapters/style.safetensors")", ":3: loras: must be an array"},
      {R"("loras": [3])", ":3: loras[0]: must be an object"},
      {R"("loras": [{"scale": 1}])", ":3: loras[0].path: required field is missing"},
      {R"("loras": [{"path": ""}])", ":3: loras[0].path: is empty"},
      {R"("loras": [{"path": 7}])", ":3: loras[0].path: must be a string"},
      {R"("loras": [{"path": "adapters/style.safetensors", "weight": 1}])", ":3: loras[0].weight: unknown field"},
      {R"("loras": [{"path": "adapters/style.safetensors", "scale": "1"}])", ":3: loras[0].scale: must be a number"},
      {R"("loras": [{"path": "adapters/style.safetensors", "scale": 1000.01}])", ":3: loras[0].scale: 1000.01 is outside"},
      {"\"loras\": " + many, ":3: loras: 65 adapters, more than 64"},
      {R"("loras": [{"path": "adapters/style.safetensors"}, {"path": "adapters/../adapters/style.safetensors"}])",
       ":3: loras[1].path: adapters/../adapters/style.safetensors is listed twice (also loras[0])"},
      {R"("loras": [{"path": "adapters/none.safetensors"}])", ":3: loras[0].path: adapters/none.safetensors does not exist"},
      {R"("loras": [{"path": "adapters"}])", ":3: loras[0].path: adapters does not end in .safetensors"},
  };
  for (const auto& [field, want] : cases) {
    const std::string line = R"({"id": "a", "prompt": "x", )" + field + "}";
    const std::string e = error_of([&] { request(m, line); });
    EXPECT_NE(e.find(file + want), std::string::npos) << field << " -> " << e;
  }
}

TEST_F(LoraJobFiles, RequestAdaptersStayInsideWhatTheUserNamed) {
  fs::create_symlink(dir_ / "elsewhere" / "far.safetensors", job_ / "adapters" / "escape.safetensors");
  fs::create_directories(dir_ / "common");
  write("common/ok.safetensors", "ok");
  write("common/job-set.safetensors", "job");
  fs::create_directories(job_ / "adapters" / "dir.safetensors");
  ASSERT_EQ(::mkfifo((job_ / "adapters" / "fifo.safetensors").c_str(), 0600), 0);
  const Manifest m = resolved("[[loras]]\npath = \"../common/job-set.safetensors\"\n");
  auto error = [&](const std::string& path) {
    return error_of([&] { request(m, R"({"id": "a", "prompt": "x", "loras": [{"path": ")" + path + "\"}]}"); });
  };
  EXPECT_NE(error("../elsewhere/far.safetensors").find("loras[0].path: ../elsewhere/far.safetensors resolves to " +
                                                        (dir_ / "elsewhere" / "far.safetensors").string() +
                                                        ", outside the folders"),
            std::string::npos)
      << error("../elsewhere/far.safetensors");
  EXPECT_NE(error((dir_ / "elsewhere" / "far.safetensors").string()).find("outside the folders"), std::string::npos);
  // A symlink inside the folder that leads out is judged by where it leads.
  EXPECT_NE(error("adapters/escape.safetensors").find("outside the folders"), std::string::npos);
  EXPECT_NE(error("adapters/dir.safetensors").find("is a folder"), std::string::npos);
  EXPECT_NE(error("adapters/fifo.safetensors").find("is not a regular file (a pipe)"), std::string::npos);
  // The folder of a [[loras]] file is allowed: ../common/ok.safetensors is the user's choice.
  EXPECT_EQ(error("../common/ok.safetensors"), "");
  // [lora] dirs widens the rule.
  const Manifest wide = resolved("[lora]\ndirs = [\"../elsewhere\"]\n");
  const JobRequest r = request(wide, R"({"id": "a", "prompt": "x", "loras": [{"path": "adapters/escape.safetensors"}]})");
  EXPECT_EQ(r.gen.lora_set()[0].path, (dir_ / "elsewhere" / "far.safetensors").string());
  EXPECT_EQ(r.lora_written[0], "adapters/escape.safetensors");
  // The same rule on every rank: a second reader gives the same verdict and path.
  EXPECT_EQ(request(wide, R"({"id": "a", "prompt": "x", "loras": [{"path": "adapters/escape.safetensors"}]})")
                .gen.lora_set()[0]
                .path,
            r.gen.lora_set()[0].path);
}

TEST_F(LoraJobFiles, HashIsTheFilesXxh3InChunks) {
  // Larger than two chunks, not a multiple of one.
  std::string bytes(2 * kLoraHashChunk + 12345, '\0');
  std::mt19937 rng(7);
  for (char& c : bytes) c = static_cast<char>(rng());
  const std::string path = write("job/adapters/big.safetensors", bytes);
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  EXPECT_EQ(lora_file_hash(path), fmt::format("{:016x}{:016x}", h.high64, h.low64));
  const std::string empty = write("job/adapters/empty.safetensors", "");
  const XXH128_hash_t e = XXH3_128bits(nullptr, 0);
  EXPECT_EQ(lora_file_hash(empty), fmt::format("{:016x}{:016x}", e.high64, e.low64));
  EXPECT_NE(lora_file_hash(path), lora_file_hash(empty));
  EXPECT_THROW(lora_file_hash((job_ / "adapters" / "gone.safetensors").string()), IoError);
  fs::create_symlink(path, job_ / "adapters" / "link.safetensors");  // a canonical path never is one
  EXPECT_THROW(lora_file_hash((job_ / "adapters" / "link.safetensors").string()), ConfigError);

  // Each distinct file once; the records name them as written and resolved.
  const Manifest m = resolved("[[loras]]\npath = \"adapters/style.safetensors\"\nscale = 0.5\n");
  std::vector<JobRequest> rs = {
      request(m, R"({"id": "a", "prompt": "x"})"),
      request(m, R"({"id": "b", "prompt": "x", "loras": [{"path": "adapters/subject.safetensors"},)"
                 R"( {"path": "./adapters/style.safetensors", "scale": 2}]})"),
      request(m, R"({"id": "c", "prompt": "x", "loras": []})")};
  uint64_t total = 0;
  const LoraHashes hashes = hash_lora_files(rs, &total);
  EXPECT_EQ(hashes.size(), 2u);
  EXPECT_EQ(total, std::string("style bytes").size() + std::string("subject bytes").size());
  EXPECT_EQ(parse_lora_hashes(lora_hashes_json(hashes)), hashes);
  const auto a = lora_records(rs[0], m, hashes);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].path, "adapters/style.safetensors");
  EXPECT_EQ(a[0].resolved, (job_ / "adapters" / "style.safetensors").string());
  EXPECT_EQ(a[0].scale, 0.5);
  EXPECT_EQ(a[0].xxh3, lora_file_hash(a[0].resolved));
  const auto b = lora_records(rs[1], m, hashes);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].path, "./adapters/style.safetensors");
  EXPECT_EQ(b[1].xxh3, a[0].xxh3);
  EXPECT_TRUE(lora_records(rs[2], m, hashes).empty());
  EXPECT_EQ(lora_records_json(lora_records(rs[2], m, hashes)), "");
  EXPECT_EQ(nlohmann::json::parse(lora_records_json(a))[0]["xxh3"], a[0].xxh3);

  // Distinct sets in order of first appearance, the base model among them.
  const std::vector<const JobRequest*> order = {&rs[2], &rs[0], &rs[1], &rs[0], &rs[2]};
  const auto sets = distinct_lora_sets(order);
  ASSERT_EQ(sets.size(), 3u);
  EXPECT_TRUE(sets[0].empty());
  EXPECT_EQ(sets[1], rs[0].gen.lora_set());
  EXPECT_EQ(sets[2], rs[1].gen.lora_set());
}

TEST_F(LoraJobFiles, RecordsNameTheAdaptersAndResumeComparesThem) {
  ResultRecord r;
  r.id = "a";
  r.status = "done";
  r.path = "images/a.png";
  const std::string plain = r.to_json().dump();
  EXPECT_EQ(plain.find("loras"), std::string::npos);  // a line without adapters is what it always was
  r.loras = {{"adapters/style.safetensors", "/abs/adapters/style.safetensors", 0.1 + 0.2,
              "0123456789abcdef0123456789abcdef"}};
  const ResultRecord back = parse_result_record(r.to_json().dump());
  EXPECT_EQ(back.loras, r.loras);  // the scale to the last bit
  EXPECT_TRUE(parse_result_record(plain).loras.empty());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("loras": 3)", "\"loras\" must be an array"},
      {R"("loras": [3])", "\"loras\"[0] must be an object"},
      {R"("loras": [{"path": "a", "resolved": "/a", "scale": 1, "xxh3": "00"}])", "must be 32 hex digits"},
      {R"("loras": [{"path": "a", "resolved": "/a", "scale": 1e9, "xxh3": "0123456789abcdef0123456789abcdef"}])",
       "\"scale\" must be a number"},
      {R"("loras": [{"resolved": "/a", "scale": 1, "xxh3": "0123456789abcdef0123456789abcdef"}])",
       "\"loras\"[0]: \"path\" is missing"},
  };
  for (const auto& [field, want] : bad) {
    const std::string line = R"({"id": "a", "status": "done", "path": "images/a.png", )" + field + "}";
    try {
      parse_result_record(line);
      ADD_FAILURE() << field << " was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }

  const LoraRecord style{"a.safetensors", "/x/a.safetensors", 1.0, "0123456789abcdef0123456789abcdef"};
  LoraRecord other_bytes = style;
  other_bytes.xxh3 = "fedcba9876543210fedcba9876543210";
  LoraRecord other_scale = style;
  other_scale.scale = 0.5;
  LoraRecord moved = style;
  moved.path = "new/a.safetensors";
  moved.resolved = "/y/new/a.safetensors";
  EXPECT_FALSE(lora_change({style}, {style}).content);
  EXPECT_FALSE(lora_change({style}, {style}).names);
  EXPECT_EQ(lora_change({style}, {style}).what, "");
  EXPECT_TRUE(lora_change({style}, {other_bytes}).content);
  EXPECT_TRUE(lora_change({style}, {other_scale}).content);
  EXPECT_TRUE(lora_change({}, {style}).content);  // a record from before adapters, or made without
  EXPECT_TRUE(lora_change({style}, {}).content);
  EXPECT_TRUE(lora_change({style, other_scale}, {other_scale, style}).content);  // the order of the sum
  const LoraChange renamed = lora_change({style}, {moved});
  EXPECT_FALSE(renamed.content);
  EXPECT_TRUE(renamed.names);
  EXPECT_NE(renamed.what.find("recorded with adapters [a.safetensors x1"), std::string::npos) << renamed.what;
  EXPECT_NE(renamed.what.find("now asks for [new/a.safetensors x1"), std::string::npos) << renamed.what;
  EXPECT_NE(lora_change({}, {style}).what.find("recorded with adapters [none]"), std::string::npos);
}

// How many times running `units` in order changes the adapter set in force,
// starting from the base model: what group_by_lora_set keeps low.
int64_t lora_switches(const std::vector<Unit>& units) {
  int64_t switches = 0;
  std::string in_force;  // the base model
  for (const Unit& unit : units) {
    if (unit.empty()) continue;
    std::string key = lora::lora_set_key(unit.front()->gen.lora_set());
    if (key != in_force) ++switches;
    in_force = std::move(key);
  }
  return switches;
}

TEST(LoraSchedule, UnitsOfOneSetRunTogether) {
  auto req = [](const std::string& id, std::optional<std::vector<lora::LoraChoice>> set) {
    JobRequest r;
    r.id = id;
    r.gen.loras = std::move(set);
    return r;
  };
  const std::vector<lora::LoraChoice> a = {{"/a.safetensors", 1.0}}, b = {{"/b.safetensors", 0.5}};
  const std::vector<lora::LoraChoice> a_other_scale = {{"/a.safetensors", 0.7}};
  std::vector<JobRequest> rs = {req("0", a), req("1", b), req("2", std::nullopt), req("3", a),
                                req("4", a_other_scale), req("5", b), req("6", std::vector<lora::LoraChoice>{})};
  std::vector<Unit> units;
  for (const auto& r : rs) units.push_back({&r});
  EXPECT_EQ(lora_switches(units), 7);  // a b base a a' b base: from the base model, 7 changes
  group_by_lora_set(units);
  std::vector<std::string> ids;
  for (const Unit& u : units) ids.push_back(u.front()->id);
  // Sets in order of first appearance (a, b, the base model, a'), each set's units in their order;
  // unset and [] are the same set (no adapters).
  EXPECT_EQ(ids, (std::vector<std::string>{"0", "3", "1", "5", "2", "6", "4"}));
  EXPECT_EQ(lora_switches(units), 4);  // a, b, base, a'
  std::vector<Unit> base_only = {{&rs[2]}, {&rs[6]}};
  EXPECT_EQ(lora_switches(base_only), 0);
  // The assignment stays (same units per replica), only the order changes.
  auto per_replica = assign_units(units, 2, [](const JobRequest&) { return 1.0; });
  size_t total = 0;
  for (auto& q : per_replica) {
    const size_t n = q.size();
    group_by_lora_set(q);
    EXPECT_EQ(q.size(), n);
    total += n;
  }
  EXPECT_EQ(total, rs.size());
}

}  // namespace
}  // namespace tprun::jobs
