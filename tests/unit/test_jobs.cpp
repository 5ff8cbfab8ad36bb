// Job manifests, request files, seeds and the results log (jobs/).
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "jobs/job_runner.h"
#include "jobs/job_schedule.h"
#include "jobs/manifest.h"
#include "jobs/merge_results.h"
#include "jobs/output_folder.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "pipelines/png_image.h"
#include "pipelines/request_checks.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

class JobFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tprun-jobs-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_ / "model");
    std::ofstream(dir_ / "model" / "model_index.json") << "{}";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
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
  fs::path dir_;
  static inline int counter_ = 0;
};

constexpr const char* kGood = R"(model = "model"
dtype = "fp32"
requests = "prompts.jsonl"

[parallel]
tp = 2
dp = 2

[defaults]
height = 64
width = 64
steps = 4
seed = 42

[output]
dir = "out"
formats = ["png"]
)";

TEST_F(JobFiles, ManifestParsesAndResolvesPaths) {
  const auto path = write("job.toml", kGood);
  write("prompts.jsonl", "{\"id\": \"a\", \"prompt\": \"x\"}\n");
  Manifest m = parse_manifest(path);
  EXPECT_EQ(m.model, (dir_ / "model").string());
  EXPECT_EQ(m.requests, (dir_ / "prompts.jsonl").string());
  EXPECT_EQ(m.output_dir, (dir_ / "out").string());
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(m.defaults.steps, 4);
  EXPECT_EQ(m.defaults.seed, 42u);
  EXPECT_FALSE(m.defaults.guidance.has_value());  // unset: the pipeline's default
  EXPECT_FALSE(m.shard_text_encoders.has_value());
  EXPECT_EQ(parse_manifest(path, {parse_override("parallel.shard_text_encoders=false")}).shard_text_encoders, false);
  EXPECT_FALSE(m.shard_modulation);
  EXPECT_TRUE(parse_manifest(path, {parse_override("parallel.shard_modulation=true")}).shard_modulation);
  EXPECT_THROW(parse_manifest(path, {parse_override("parallel.shard_modulation=3")}), ConfigError);
  EXPECT_TRUE(m.png);
  EXPECT_NO_THROW(check_paths(m));
  EXPECT_TRUE(m.memory.layerwise_storage.empty());
  const Manifest c = parse_manifest(path, {parse_override("memory.layerwise_casting={storage=\"float8_e5m2\", skip=[\"^a$\", \"b\"]}")});
  EXPECT_EQ(c.memory.layerwise_storage, "float8_e5m2");
  ASSERT_TRUE(c.memory.layerwise_skip.has_value());
  EXPECT_EQ(*c.memory.layerwise_skip, (std::vector<std::string>{"^a$", "b"}));
  EXPECT_FALSE(parse_manifest(path, {parse_override("memory.layerwise_casting={storage=\"float8_e4m3fn\"}")})
                   .memory.layerwise_skip.has_value());
}

TEST_F(JobFiles, OverridesApplyBeforeValidation) {
  const auto path = write("job.toml", kGood);
  Manifest m = parse_manifest(path, {parse_override("defaults.steps=8"), parse_override("parallel.tp=1"),
                                     parse_override("defaults.negative_prompt=blurry"),
                                     parse_override("output.dir=\"/tmp/x y\"")});
  EXPECT_EQ(m.defaults.steps, 8);
  EXPECT_EQ(m.tp, 1);
  EXPECT_EQ(m.defaults.negative_prompt, "blurry");  // a bare word is a string
  EXPECT_EQ(m.output_dir, "/tmp/x y");
  const auto e = error_of([&] { parse_manifest(path, {parse_override("defaults.stepz=8")}); });
  EXPECT_NE(e.find("--set defaults.stepz: unknown key"), std::string::npos) << e;
  const auto t = error_of([&] { parse_manifest(path, {parse_override("defaults.steps=\"four\"")}); });
  EXPECT_NE(t.find("--set defaults.steps: must be an integer"), std::string::npos) << t;
  EXPECT_THROW(parse_override("no-equals-sign"), ConfigError);
}

TEST_F(JobFiles, ManifestErrorsNameFileLineAndKey) {
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {"model = \"m\"\nrequests = \"r\"\nstepz = 3\n", "job.toml:3: stepz: unknown key"},
      {"model = \"m\"\nrequests = \"r\"\n[defaults]\nsteps = \"four\"\n", "job.toml:4: defaults.steps: must be an integer"},
      {"model = \"m\"\nrequests = \"r\"\n[defaults]\nheight = -5\n", "job.toml:4: defaults.height: -5 is outside"},
      {"model = \"m\"\nrequests = \"r\"\n[paralel]\ntp = 2\n", "job.toml:3: paralel: unknown key"},
      {"model = \"m\"\nrequests = \"r\"\n[output]\nformats = [\"gif\"]\n", "output.formats: 'gif' is not one of"},
      {"model = \"m\"\nrequests = \"r\"\ndtype = \"fp8\"\n", "job.toml:3: dtype: 'fp8' is not one of"},
      {"model = \"m\"\nrequests = \"r\"\n[memory]\noffload = true\n",
       "job.toml:4: memory.offload: must be \"model\", \"sequential\" or a table"},
      {"model = \"m\"\nrequests = \"r\"\n[memory.offload]\ntype = \"block_level\"\nto = \"disk\"\n",
       "memory.offload.disk_path: required when to = \"disk\""},
      {"model = \"m\"\nrequests = \"r\"\n[memory.device_map]\ntransformer.single_transformer_blocks.1 = 3.5\n",
       "job.toml:4: memory.device_map.transformer.single_transformer_blocks.1: must be a device string"},
      {"model = \"m\"\nrequests = \"r\"\n[memory]\nmax_memory = { cpu = \"10 apples\" }\n",
       "job.toml:4: memory.max_memory.cpu"},
      {"model = \"m\"\nrequests = \"r\"\n[memory]\nlayerwise_casting = { storage = \"float8_e4m3fn\", skip = [\"(x\"] }\n",
       "job.toml:4: memory.layerwise_casting.skip: '(x' is not a regular expression"},
      {"model = \"m\"\nrequests = \"r\"\n[memory.layerwise_casting]\nstorage = \"bf16\"\n",
       "job.toml:4: memory.layerwise_casting.storage: 'bf16' is not one of float8_e4m3fn, float8_e5m2"},
      {"model = \"m\"\nrequests = \"r\"\n[memory.layerwise_casting]\nskip = []\n",
       "memory.layerwise_casting.storage: required key is missing"},
      {"model = \"m\"\nrequests = \"r\"\n[memory]\nlayerwise_casting = \"fp8\"\n",
       "job.toml:4: memory.layerwise_casting: must be a table"},
      {"requests = \"r\"\n", "model: required key is missing"},
      {"model = \"m\"\nrequests = \"r\"\n[defaults\n", "job.toml:3:"},
      {"model = \"m\"\nrequests = \"r\"\nparallel = 3\n", "job.toml:3: parallel: must be a table"},
  };
  for (const auto& c : cases) {
    const auto path = write("job.toml", c.text);
    const auto e = error_of([&] { parse_manifest(path); });
    EXPECT_NE(e.find(c.want), std::string::npos) << "manifest:\n" << c.text << "\nerror: " << e;
  }
  EXPECT_NE(error_of([&] { parse_manifest((dir_ / "missing.toml").string()); }).find("no such file"), std::string::npos);
  const auto path = write("job.toml", "model = \"nope\"\nrequests = \"nope.jsonl\"\n");
  EXPECT_NE(error_of([&] { check_paths(parse_manifest(path)); }).find("model: "), std::string::npos);
}

TEST_F(JobFiles, RequestsApplyDefaultsAndOverrides) {
  pipelines::GenerationRequest d;
  d.steps = 4;
  d.seed = 9;
  d.negative_prompt = "ugly";
  const auto path = write("r.jsonl",
                          "# a comment\n"
                          "{\"id\": \"a\", \"prompt\": \"fox\"}\n"
                          "\n"
                          "{\"id\": 7, \"prompt\": \"cat\", \"steps\": 2, \"seed\": 5, \"height\": 32, "
                          "\"negative_prompt\": \"\"}\n");
  auto rs = read_requests(path, d);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].id, "a");
  EXPECT_EQ(rs[0].line, 2);
  EXPECT_EQ(rs[0].gen.steps, 4);
  EXPECT_EQ(rs[0].gen.seed, derive_seed(9, "a"));
  EXPECT_EQ(rs[0].gen.negative_prompt.value_or(""), "ugly");
  EXPECT_EQ(rs[1].id, "7");
  EXPECT_EQ(rs[1].line, 4);
  EXPECT_EQ(rs[1].gen.steps, 2);
  EXPECT_EQ(rs[1].gen.seed, 5u);
  EXPECT_TRUE(rs[1].seed_given);
  EXPECT_EQ(rs[1].gen.height, 32);
  EXPECT_FALSE(rs[1].gen.negative_prompt.has_value());  // "" overrides the manifest's default
  EXPECT_FALSE(rs[0].gen.height.has_value());           // neither sets it: the pipeline's default
}

TEST_F(JobFiles, RequestErrorsNameLineAndField) {
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {"{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"prompt\": \"y\"}\n", "r.jsonl:2: id: 'a' is used twice (first on line 1)"},
      {"{\"id\": \"a\", \"prompt\": \"x\"\n", "r.jsonl:1: json:"},
      {"{\"prompt\": \"x\"}\n", "r.jsonl:1: id: required field is missing"},
      {"{\"id\": \"a\"}\n", "r.jsonl:1: prompt: required field is missing"},
      {"{\"id\": \"a\", \"prompt\": \"x\", \"stepz\": 3}\n", "r.jsonl:1: stepz: unknown field"},
      {"{\"id\": \"a\", \"prompt\": \"x\", \"steps\": \"3\"}\n", "r.jsonl:1: steps: must be an integer"},
      {"{\"id\": \"../etc\", \"prompt\": \"x\"}\n", "r.jsonl:1: id: '../etc' is not a valid id"},
      {"{\"id\": \"a\", \"prompt\": \"x\", \"seed\": -1}\n", "r.jsonl:1: seed: must be a non-negative integer"},
      {"[1, 2]\n", "r.jsonl:1: json: each line must be one JSON object"},
      {"{\"id\": \"a\", \"prompt\": \"x\", \"id\": \"b\"}\n", "r.jsonl:1: json:"},
      {"\n# only comments\n", "holds no request"},
  };
  for (const auto& c : cases) {
    const auto path = write("r.jsonl", c.text);
    const auto e = error_of([&] { read_requests(path, {}); });
    EXPECT_NE(e.find(c.want), std::string::npos) << "requests:\n" << c.text << "error: " << e;
  }
}

// Issue 32: a request may carry a frame count, bounded as every request
// value is; a manifest's [defaults] may set it; unset stays unset (the
// pipeline's default: 1 for every image pipeline).
TEST_F(JobFiles, RequestFramesAreReadBoundedAndDefaulted) {
  pipelines::GenerationRequest d;
  d.frames = 5;
  const auto path = write("r.jsonl",
                          "{\"id\": \"a\", \"prompt\": \"fox\"}\n"
                          "{\"id\": \"b\", \"prompt\": \"fox\", \"frames\": 81}\n"
                          "{\"id\": \"c\", \"prompt\": \"fox\", \"frames\": 1}\n");
  auto rs = read_requests(path, d);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].gen.frames, 5);  // the manifest's default
  EXPECT_EQ(rs[1].gen.frames, 81);
  EXPECT_EQ(rs[2].gen.frames, 1);
  EXPECT_FALSE(read_requests(path, {})[0].gen.frames.has_value());
  EXPECT_EQ(read_requests(path, {})[0].gen.frame_count(), 1);
  struct Case {
    std::string value, want;
  };
  const std::vector<Case> cases = {
      {"0", "bad.jsonl:1: frames: 0 is outside [1, 4096]"},
      {"-3", "bad.jsonl:1: frames: -3 is outside [1, 4096]"},
      {"4097", "bad.jsonl:1: frames: 4097 is outside [1, 4096]"},
      {"18446744073709551615", "bad.jsonl:1: frames: 18446744073709551615 is outside [1, 4096]"},
      {"99999999999999999999999", "bad.jsonl:1: frames: must be an integer"},
      {"2.5", "bad.jsonl:1: frames: must be an integer, found 2.5"},
      {"9.0", "bad.jsonl:1: frames: must be an integer"},
      {"\"9\"", "bad.jsonl:1: frames: must be an integer, found \"9\""},
      {"true", "bad.jsonl:1: frames: must be an integer, found true"},
      {"null", "bad.jsonl:1: frames: must be an integer, found null"},
  };
  for (const auto& c : cases) {
    const auto bad = write("bad.jsonl", "{\"id\": \"a\", \"prompt\": \"x\", \"frames\": " + c.value + "}\n");
    const auto e = error_of([&] { read_requests(bad, {}); });
    EXPECT_NE(e.find(c.want), std::string::npos) << c.value << ": " << e;
  }
  // [defaults] frames: read and bounded like every other default.
  const auto job = write("job.toml", std::string(kGood) + "");
  EXPECT_FALSE(parse_manifest(job).defaults.frames.has_value());
  EXPECT_EQ(parse_manifest(job, {parse_override("defaults.frames=9")}).defaults.frames, 9);
  for (const char* bad : {"defaults.frames=0", "defaults.frames=-1", "defaults.frames=100000", "defaults.frames=2.5",
                          "defaults.frames=\"9\"", "defaults.frames=1e400"}) {
    const auto e = error_of([&] { parse_manifest(job, {parse_override(bad)}); });
    EXPECT_NE(e.find("--set defaults.frames:"), std::string::npos) << bad << ": " << e;
  }
}

// An image pipeline takes only frames = 1 (set or not), a frame-sequence
// pipeline its own limit and step; refused by name before any weight.
TEST_F(JobFiles, DefaultsFramesCheckedAgainstThePipeline) {
  const auto job = write("job.toml", std::string(kGood) + "");
  pipelines::RequestOptions image;
  image.cls = "FluxPipeline";
  EXPECT_NO_THROW(check_defaults(parse_manifest(job), image));
  EXPECT_NO_THROW(check_defaults(parse_manifest(job, {parse_override("defaults.frames=1")}), image));
  auto e = error_of([&] { check_defaults(parse_manifest(job, {parse_override("defaults.frames=9")}), image); });
  EXPECT_NE(e.find("--set defaults.frames: FluxPipeline makes images (one frame each), not frame sequences: 9 "
                   "frames cannot be made; remove it or give 1"),
            std::string::npos)
      << e;
  pipelines::RequestOptions video;
  video.cls = "VideoPipeline";
  video.max_frames = 81;
  video.frame_multiple = 4;
  video.frame_multiple_reason = "its VAE compresses time 4x";
  EXPECT_NO_THROW(check_defaults(parse_manifest(job, {parse_override("defaults.frames=9")}), video));
  EXPECT_NO_THROW(check_defaults(parse_manifest(job, {parse_override("defaults.frames=1")}), video));
  e = error_of([&] { check_defaults(parse_manifest(job, {parse_override("defaults.frames=10")}), video); });
  EXPECT_NE(e.find("defaults.frames: 10 is not 4 x k + 1 frames, which VideoPipeline takes (its VAE compresses time "
                   "4x); try 9 or 13"),
            std::string::npos)
      << e;
  e = error_of([&] { check_defaults(parse_manifest(job, {parse_override("defaults.frames=85")}), video); });
  EXPECT_NE(e.find("defaults.frames: 85 is beyond VideoPipeline's limit of 81 frames"), std::string::npos) << e;
  // The pipelines' own check (a request): RequestError naming the field.
  pipelines::GenerationRequest r;
  r.frames = 2;
  try {
    pipelines::need_request_options(r, image);
    ADD_FAILURE() << "frames 2 accepted by an image pipeline";
  } catch (const RequestError& x) {
    EXPECT_EQ(std::string(x.what()).rfind("frames: FluxPipeline makes images", 0), 0u) << x.what();
  }
  r.frames = 0;  // the shared bound first
  EXPECT_THROW(pipelines::need_request_options(r, video), RequestError);
}

// A frame sequence's record says F; an image's line is exactly what it was.
TEST(ResultRecords, FramesOnlyWhereThereAreSeveral) {
  ResultRecord a;
  a.id = "a";
  a.status = "done";
  a.path = "images/a.png";
  a.seed = 7;
  a.height = 32;
  a.width = 48;
  a.steps = 2;
  a.replica = 1;
  EXPECT_EQ(a.to_json().dump(),
            "{\"error\":\"\",\"height\":32,\"id\":\"a\",\"path\":\"images/a.png\",\"replica\":1,\"seed\":7,"
            "\"status\":\"done\",\"steps\":2,\"timings\":{\"decode_s\":0.0,\"denoise_s\":0.0,\"encode_s\":0.0,"
            "\"total_s\":0.0},\"width\":48}");
  EXPECT_EQ(parse_result_record(a.to_json().dump()).frames, 1);
  ResultRecord v = a;
  v.frames = 81;
  v.path = "store/run-1.h5:/images/a";
  const std::string line = v.to_json().dump();
  EXPECT_NE(line.find("\"frames\":81"), std::string::npos) << line;
  EXPECT_EQ(parse_result_record(line).frames, 81);
  for (const char* bad : {"0", "-1", "4097", "2.5", "\"9\""}) {
    std::string text = "{\"id\":\"a\",\"status\":\"done\",\"frames\":" + std::string(bad) + "}";
    EXPECT_THROW(parse_result_record(text), std::runtime_error) << text;
  }
}

TEST(Seeds, DependOnBaseAndIdOnly) {
  EXPECT_EQ(derive_seed(0, "fox"), derive_seed(0, "fox"));
  EXPECT_NE(derive_seed(0, "fox"), derive_seed(1, "fox"));
  EXPECT_NE(derive_seed(0, "fox"), derive_seed(0, "fox2"));
  EXPECT_LT(derive_seed(123, "x"), uint64_t{1} << 53);
}

TEST_F(JobFiles, ResultsLogResumesAndDropsTornLines) {
  {
    ResultsLog log(dir_.string());
    log.begin({});
    ResultRecord a;
    a.id = "a";
    a.status = "done";
    a.path = "images/a.png";
    log.append(a);
    ResultRecord b;
    b.id = "b";
    b.status = "failed";
    b.error = "height 30 is not a multiple of 16";
    log.append(b);
  }
  // A writer killed mid-line.
  std::ofstream(dir_ / "results.jsonl", std::ios::app) << "{\"id\": \"c\", \"sta";
  ResultsLog log(dir_.string());
  EXPECT_EQ(log.torn_lines(), 1);
  ASSERT_EQ(log.records().size(), 2u);
  EXPECT_EQ(log.records().at("b").error, "height 30 is not a multiple of 16");
  log.begin({"b"});  // b runs again: its record goes
  ResultRecord b2;
  b2.id = "b";
  b2.status = "done";
  log.append(b2);
  std::ifstream in(dir_ / "results.jsonl");
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"id\":\"a\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"id\":\"b\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"status\":\"done\""), std::string::npos);
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(Shards, ParseIndexOfCount) {
  RunOptions o;
  parse_shard("2/5", o);
  EXPECT_EQ(o.shard_index, 2);
  EXPECT_EQ(o.shard_count, 5);
  EXPECT_THROW(parse_shard("5/5", o), ConfigError);
  EXPECT_THROW(parse_shard("x/5", o), ConfigError);
  EXPECT_THROW(parse_shard("3", o), ConfigError);
  ::setenv("SLURM_ARRAY_TASK_ID", "7", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "5", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  parse_shard("slurm", o);
  EXPECT_EQ(o.shard_index, 2);
  EXPECT_EQ(o.shard_count, 4);
  ::unsetenv("SLURM_ARRAY_TASK_COUNT");
  EXPECT_THROW(parse_shard("slurm", o), ConfigError);
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("SLURM_ARRAY_TASK_MIN");
}

TEST_F(JobFiles, MergeResultsLinksOutputsAndRefusesDoubleDone) {
  auto chunk = [&](const std::string& name, const std::vector<std::pair<std::string, std::string>>& recs) {
    const fs::path d = dir_ / name;
    fs::create_directories(d / "images");
    ResultsLog log(d.string());
    log.begin({});
    for (const auto& [id, status] : recs) {
      ResultRecord r;
      r.id = id;
      r.status = status;
      if (status == "done") {
        r.path = "images/" + id + ".png";
        const std::vector<uint8_t> rgb(4 * 4 * 3, 9);  // merge-results links whole PNGs only
        pipelines::write_png((d / r.path).string(), rgb.data(), 4, 4, {});
      }
      log.append(r);
    }
    return d.string();
  };
  const auto a = chunk("shard-0-of-2", {{"x", "done"}, {"y", "failed"}});
  const auto b = chunk("shard-1-of-2", {{"y", "done"}, {"z", "done"}});
  const auto s = merge_results({a, b}, (dir_ / "merged").string());
  EXPECT_EQ(s.done, 3);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.chunks, 2);
  ResultsLog merged((dir_ / "merged").string());
  ASSERT_EQ(merged.records().size(), 3u);
  EXPECT_EQ(merged.records().at("y").status, "done");
  for (const char* id : {"x", "y", "z"}) EXPECT_TRUE(fs::exists(dir_ / "merged" / "images" / (std::string(id) + ".png")));
  const auto c = chunk("shard-x", {{"z", "done"}});
  const auto e = error_of([&] { merge_results({a, b, c}, (dir_ / "merged2").string()); });
  EXPECT_NE(e.find("request 'z' is done in both"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir_ / "merged2" / "results.jsonl"));
}

TEST(Schedule, BatchesFormInIdOrderAndSpreadByCost) {
  std::vector<JobRequest> rs(7);
  const char* ids[] = {"g", "b", "e", "a", "d", "c", "f"};
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].id = ids[i];
    rs[i].gen.steps = rs[i].id < "d" ? 4 : 8;  // a b c: key 4; d e f g: key 8
  }
  std::vector<const JobRequest*> todo;
  for (const auto& r : rs) todo.push_back(&r);
  auto key = [](const JobRequest& r) -> std::optional<std::string> {
    if (r.id == "f") return std::nullopt;  // refused: alone
    return std::to_string(*r.gen.steps);
  };
  auto units = make_units(todo, 2, key);
  std::vector<std::string> got;
  for (const auto& u : units) {
    std::string s;
    for (const JobRequest* r : u) s += r->id;
    got.push_back(s);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"ab", "c", "de", "f", "g"}));
  // Reversed input order: the same units.
  std::reverse(todo.begin(), todo.end());
  EXPECT_EQ(make_units(todo, 2, key).size(), units.size());
  EXPECT_EQ(make_units(todo, 1, key).size(), 7u);

  // LPT over two replicas by cost (steps): de(16) f(8) g(8) ab(8) c(4).
  auto per = assign_units(units, 2, [](const JobRequest& r) { return static_cast<double>(*r.gen.steps); });
  double load[2] = {0, 0};
  for (int k = 0; k < 2; ++k)
    for (const auto& u : per[static_cast<size_t>(k)])
      for (const JobRequest* r : u) load[k] += static_cast<double>(*r->gen.steps);
  EXPECT_EQ(load[0] + load[1], 44.0);
  EXPECT_LE(std::max(load[0], load[1]), 24.0);  // within 4/3 of the optimum 22
  EXPECT_EQ(per[0].front().front()->id, "d");    // the largest unit first, onto replica 0
}

// Only a torn last line is an interrupted write; any other bad line is
// someone's text: an error naming file and line, and the file as it was.
TEST_F(JobFiles, ResultsLogRefusesABadLineAndLeavesTheFile) {
  const std::string text =
      "{\"id\":\"a\",\"status\":\"done\",\"path\":\"images/a.png\"}\n"
      "my notes about this run\n"
      "{\"id\":\"b\",\"status\":\"failed\",\"error\":\"x\"}\n";
  const std::string path = write("results.jsonl", text);
  const auto e = error_of([&] { ResultsLog log(dir_.string()); });
  EXPECT_NE(e.find(path + ":2: not a result record"), std::string::npos) << e;
  std::ifstream in(path, std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, text);
  // A record with a status that is neither done nor failed is refused too.
  write("results.jsonl", "{\"id\":\"a\",\"status\":\"maybe\"}\n{\"id\":\"b\",\"status\":\"done\"}\n");
  EXPECT_NE(error_of([&] { ResultsLog log(dir_.string()); }).find("results.jsonl:1:"), std::string::npos);
  // Only the last line without a newline is dropped.
  write("results.jsonl", "{\"id\":\"a\",\"status\":\"done\"}\n\n{\"id\":\"b\",\"sta");
  ResultsLog log(dir_.string());
  EXPECT_EQ(log.torn_lines(), 1);
  EXPECT_EQ(log.torn_text(), "{\"id\":\"b\",\"sta");
  EXPECT_EQ(log.records().size(), 1u);
}

// A failed append (here: a file size limit, EFBIG) raises IoError naming the
// path and the errno text, and cuts the log back to its last complete line.
TEST_F(JobFiles, ResultsLogAppendFailureCutsBackToTheLastLine) {
  ResultsLog log(dir_.string());
  log.begin({});
  ResultRecord a;
  a.id = "a";
  a.status = "done";
  log.append(a);
  const auto size = fs::file_size(log.path());
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = size + 20;  // room for part of the next record only
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  ResultRecord b;
  b.id = "b";
  b.status = "failed";
  b.error = std::string(200, 'x');
  std::string message;
  try {
    log.append(b);
  } catch (const IoError& e) {
    message = e.what();
    EXPECT_EQ(e.exit_code(), exit_code::kIo);
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find(log.path()), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  EXPECT_EQ(fs::file_size(log.path()), size);
  ResultsLog again(dir_.string());
  EXPECT_EQ(again.torn_lines(), 0);
  EXPECT_EQ(again.records().size(), 1u);
}

TEST_F(JobFiles, OutputLockRefusesASecondHolderAndIsFreedOnRelease) {
  auto first = OutputLock::acquire(dir_.string());
  ASSERT_TRUE(first->held());
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::string e;
  try {
    OutputLock::acquire(dir_.string());
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find(fmt::format("output folder {} in use by pid {} on {}", dir_.string(), ::getpid(), host)),
            std::string::npos)
      << e;
  first.reset();  // what the kernel does when the holder dies
  EXPECT_TRUE(OutputLock::acquire(dir_.string())->held());
}

TEST_F(JobFiles, OutputPlacementRefusesTheModelFolder) {
  Manifest m = parse_manifest(write("job.toml", kGood));
  for (const auto& out : {dir_ / "model", dir_ / "model" / "out", dir_ / "model" / "." / "x" / ".."}) {
    m.output_dir = out.string();
    const auto e = error_of([&] { check_output_placement(m); });
    EXPECT_NE(e.find("is inside the model folder"), std::string::npos) << out << ": " << e;
  }
  m.output_dir = (dir_ / "out").string();
  EXPECT_EQ(check_output_placement(m), "");  // does not exist yet
  fs::create_directories(dir_ / "out");
  EXPECT_EQ(check_output_placement(m), "");  // empty
  std::ofstream(dir_ / "out" / "thesis.tex") << "x";
  EXPECT_NE(check_output_placement(m).find("IS NOT EMPTY"), std::string::npos);
  std::ofstream(dir_ / "out" / "results.jsonl") << "";
  EXPECT_EQ(check_output_placement(m), "");  // a tprun output folder
  m.output_dir = write("file", "x");
  EXPECT_NE(error_of([&] { check_output_placement(m); }).find("is not a folder"), std::string::npos);
}

TEST_F(JobFiles, RequestsPathMustBeARegularFileReadWithABound) {
  const auto a = error_of([&] { check_requests_file("job.toml", dir_.string()); });
  EXPECT_NE(a.find("is a directory"), std::string::npos) << a;
  const auto b = error_of([&] { check_requests_file("job.toml", "/dev/zero"); });
  EXPECT_NE(b.find("/dev/zero is not a regular file (a character device)"), std::string::npos) << b;
  const auto c = error_of([&] { check_requests_file("job.toml", (dir_ / "nope.jsonl").string()); });
  EXPECT_NE(c.find("nope.jsonl: no such file"), std::string::npos) << c;
  const auto path = write("long.jsonl", "{\"id\": \"a\", \"prompt\": \"x\"}\n" + std::string(kMaxRequestLine + 10, ' '));
  const auto d = error_of([&] { read_requests(path, {}); });
  EXPECT_NE(d.find("long.jsonl:2: json: the line is longer than"), std::string::npos) << d;
}

TEST_F(JobFiles, LongIdsAreCutInMessages) {
  const std::string id(5000, 'a');
  const auto path = write("ids.jsonl", "{\"id\": \"" + id + "\", \"prompt\": \"x\"}\n");
  const auto e = error_of([&] { read_requests(path, {}); });
  EXPECT_NE(e.find(std::string(64, 'a') + "\u2026(5000 chars)"), std::string::npos) << e.substr(0, 300);
  EXPECT_LT(e.size(), 400u);
  EXPECT_EQ(clip_text("short"), "short");
}

// Resume trusts only complete images: signature to IEND.
TEST_F(JobFiles, PngCompletenessFindsTruncatedImages) {
  const std::vector<uint8_t> rgb(16 * 8 * 3, 7);
  const std::string path = (dir_ / "a.png").string();
  pipelines::write_png(path, rgb.data(), 16, 8, {{"prompt", "a fox"}});
  EXPECT_EQ(pipelines::png_incomplete(path), "");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t keep : {size_t{0}, size_t{5}, size_t{8}, size_t{20}, bytes.size() / 2, bytes.size() - 12,
                      bytes.size() - 1}) {
    const std::string cut = write("cut.png", bytes.substr(0, keep));
    EXPECT_NE(pipelines::png_incomplete(cut), "") << keep << " of " << bytes.size() << " bytes";
  }
  EXPECT_NE(pipelines::png_incomplete((dir_ / "none.png").string()), "");
  EXPECT_NE(pipelines::png_incomplete(write("text.png", "not a png at all")), "");
}

}  // namespace
}  // namespace tprun::jobs
