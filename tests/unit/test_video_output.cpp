// Video outputs (issue 33 item 7): a synthetic [F, H, W, 3] result written as
// an MP4 through the ffmpeg program and decoded back by it (frame count,
// size, fps, pixels within H.264's loss), its box structure walked (a cut
// file is incomplete, its tag still says tprun), a user's MP4 never replaced,
// odd sizes refused; PNG frames; the fps / guidance_2 request keys against an
// image and a video pipeline's options; the results log's fps.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jobs/manifest.h"
#include "jobs/merge_results.h"
#include "jobs/mp4_file.h"
#include "jobs/output_folder.h"
#include "jobs/results_log.h"
#include "jobs/video_output.h"
#include "pipelines/png_image.h"
#include "pipelines/request_checks.h"
#include "runtime/child_process.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

// Smooth moving gradients (H.264 keeps them within a few levels), distinct per frame.
std::vector<uint8_t> synthetic_video(int64_t frames, int64_t height, int64_t width) {
  std::vector<uint8_t> rgb(static_cast<size_t>(frames * height * width * 3));
  size_t i = 0;
  for (int64_t f = 0; f < frames; ++f) {
    for (int64_t y = 0; y < height; ++y) {
      for (int64_t x = 0; x < width; ++x) {
        rgb[i++] = static_cast<uint8_t>(40 + 2 * x + 6 * f);
        rgb[i++] = static_cast<uint8_t>(30 + 3 * y + 4 * f);
        rgb[i++] = static_cast<uint8_t>(220 - x - y - 3 * f);
      }
    }
  }
  return rgb;
}

class VideoOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tprun-video-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The tests need the ffmpeg program (tools/setup.sh installs it): a missing one fails them, naming it.
  void need_ffmpeg() { ASSERT_EQ(mp4_writer_problem(), ""); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> temporaries() const {
    std::vector<std::string> t;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      if (is_output_temp(e.path().filename().string())) t.push_back(e.path().string());
    }
    return t;
  }
  fs::path dir_;
  static inline int counter_ = 0;
};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(VideoOutput, Mp4DecodesBackAsWritten) {
  need_ffmpeg();
  const int64_t F = 9, H = 48, W = 64, fps = 16;
  const auto rgb = synthetic_video(F, H, W);
  const std::string mp4 = path("a.mp4");
  write_mp4_output(mp4, {rgb.data(), F, H, W}, fps);
  EXPECT_TRUE(temporaries().empty());
  Mp4Facts facts;
  EXPECT_EQ(mp4_incomplete(mp4, &facts), "");
  EXPECT_EQ(facts.comment, mp4_comment_tag());
  EXPECT_EQ(facts.video_samples, F);
  EXPECT_EQ(facts.width, W);
  EXPECT_EQ(facts.height, H);
  EXPECT_NEAR(facts.fps, 16.0, 1e-6);
  EXPECT_EQ(foreign_output(mp4, OutputKind::Mp4), "");
  // FFmpeg's own reading: stream facts from ffprobe, the frames decoded to RGB.
  const std::string ffmpeg = ffmpeg_program();
  const std::string ffprobe = (fs::path(ffmpeg).parent_path() / "ffprobe").string();
  const ChildRun probe = run_child({ffprobe, "-v", "error", "-select_streams", "v:0", "-count_frames", "-show_entries",
                                    "stream=codec_name,pix_fmt,width,height,r_frame_rate,nb_read_frames", "-of",
                                    "json", mp4},
                                   nullptr, 0, 60);
  ASSERT_TRUE(probe.ok()) << probe.describe();
  const auto s = nlohmann::json::parse(probe.out)["streams"][0];
  EXPECT_EQ(s["codec_name"], "h264");
  EXPECT_EQ(s["pix_fmt"], "yuv420p");
  EXPECT_EQ(s["width"], W);
  EXPECT_EQ(s["height"], H);
  EXPECT_EQ(s["r_frame_rate"], "16/1");
  EXPECT_EQ(s["nb_read_frames"], std::to_string(F));
  const ChildRun decode = run_child({ffmpeg, "-hide_banner", "-loglevel", "error", "-i", mp4, "-f", "rawvideo",
                                     "-pix_fmt", "rgb24", "pipe:1"},
                                    nullptr, 0, 60, rgb.size() + 1);
  ASSERT_TRUE(decode.ok()) << decode.describe();
  ASSERT_EQ(decode.out.size(), rgb.size());
  double sum = 0;
  int worst = 0;
  std::vector<double> frame_error(F, 0.0);
  for (size_t i = 0; i < rgb.size(); ++i) {
    const int d = std::abs(static_cast<int>(static_cast<uint8_t>(decode.out[i])) - static_cast<int>(rgb[i]));
    sum += d;
    worst = std::max(worst, d);
    frame_error[i / static_cast<size_t>(H * W * 3)] += d;
  }
  // H.264 at crf 18 in yuv420p on smooth gradients: a level or two on average, never a wrong frame.
  EXPECT_LT(sum / static_cast<double>(rgb.size()), 3.0);
  EXPECT_LE(worst, 24);
  for (int64_t f = 0; f < F; ++f) EXPECT_LT(frame_error[f] / static_cast<double>(H * W * 3), 4.0) << "frame " << f;
  // Rewritten over itself (a rerun): the file is tprun's, so it is replaced.
  write_mp4_output(mp4, {rgb.data(), F, H, W}, 8);
  EXPECT_EQ(mp4_incomplete(mp4, &facts), "");
  EXPECT_NEAR(facts.fps, 8.0, 1e-6);
}

TEST_F(VideoOutput, CutMp4IsIncompleteButStillTprunS) {
  need_ffmpeg();
  const auto rgb = synthetic_video(5, 32, 32);
  const std::string mp4 = path("a.mp4");
  write_mp4_output(mp4, {rgb.data(), 5, 32, 32}, 16);
  const std::string whole = slurp(mp4);
  const size_t n = whole.size();
  const size_t mdat = whole.find("mdat");
  ASSERT_NE(mdat, std::string::npos);
  ASSERT_GT(mdat, whole.find("moov"));  // faststart: moov first
  for (size_t keep : {n - 1, n - 17, (mdat + n) / 2, n / 2, size_t{40}, size_t{7}}) {
    const std::string cut = path(fmt::format("cut-{}.mp4", keep));
    std::ofstream(cut, std::ios::binary) << whole.substr(0, keep);
    Mp4Facts facts;
    EXPECT_NE(mp4_incomplete(cut, &facts), "") << keep;
    EXPECT_NE(output_file_problem(dir_.string(), fs::path(cut).filename().string()), "") << keep;
    if (keep > mdat + 4) {  // moov (with the tag) comes first: a file cut in its media data is still tprun's
      EXPECT_EQ(facts.comment, mp4_comment_tag()) << keep;
      EXPECT_EQ(foreign_output(cut, OutputKind::Mp4), "") << keep;
    }
  }
  // A byte more than the boxes hold: not one MP4.
  std::ofstream(path("long.mp4"), std::ios::binary) << whole << "x";
  EXPECT_NE(mp4_incomplete(path("long.mp4")), "");
  // A media offset moved past the data: a sample outside mdat.
  std::string bad = whole;
  const size_t stco = bad.find("stco");
  ASSERT_NE(stco, std::string::npos);
  bad[stco + 12] = static_cast<char>(0x7f);  // the first chunk offset's top byte
  std::ofstream(path("moved.mp4"), std::ios::binary) << bad;
  EXPECT_NE(mp4_incomplete(path("moved.mp4")).find("outside its media data"), std::string::npos)
      << mp4_incomplete(path("moved.mp4"));
  // The cut file is replaced by a whole one (resume writes it again).
  const std::string cut = path(fmt::format("cut-{}.mp4", n - 17));
  write_mp4_output(cut, {rgb.data(), 5, 32, 32}, 16);
  EXPECT_EQ(mp4_incomplete(cut), "");
}

TEST_F(VideoOutput, UsersMp4NeverReplaced) {
  need_ffmpeg();
  const auto rgb = synthetic_video(3, 16, 16);
  // A whole MP4 someone else made (no tprun tag), and a file that is no MP4 at all.
  const std::string theirs = path("theirs.mp4");
  const ChildRun made = run_child({ffmpeg_program(), "-hide_banner", "-loglevel", "error", "-f", "rawvideo",
                                   "-pix_fmt", "rgb24", "-s", "16x16", "-framerate", "4", "-i", "pipe:0", "-c:v",
                                   "libx264", "-pix_fmt", "yuv420p", "-metadata", "comment=my holiday", "-y", theirs},
                                  rgb.data(), rgb.size(), 60);
  ASSERT_TRUE(made.ok()) << made.describe();
  const std::string notes = path("notes.mp4");
  std::ofstream(notes) << "my notes\n";
  for (const std::string& p : {theirs, notes}) {
    const std::string before = slurp(p);
    const std::string why = foreign_output(p, OutputKind::Mp4);
    EXPECT_NE(why.find("exists and is not an MP4 tprun wrote"), std::string::npos) << why;
    std::string e;
    try {
      write_mp4_output(p, {rgb.data(), 3, 16, 16}, 16);
    } catch (const ConfigError& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("tprun never replaces a file it did not write"), std::string::npos) << e;
    EXPECT_EQ(slurp(p), before);
    try {
      check_output_path(p, "--out", {}, OutputKind::Mp4);
      ADD_FAILURE() << "check_output_path accepted " << p;
    } catch (const ConfigError& x) {
      EXPECT_NE(std::string(x.what()).find("tprun replaces only its own outputs"), std::string::npos) << x.what();
    }
  }
  EXPECT_NE(foreign_output(theirs, OutputKind::Mp4).find("without tprun's comment tag"), std::string::npos);
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(VideoOutput, OddSizesAndBadRatesRefusedBeforeWriting) {
  EXPECT_EQ(mp4_size_problem(480, 832), "");
  EXPECT_NE(mp4_size_problem(33, 64).find("needs an even height and width"), std::string::npos);
  EXPECT_NE(mp4_size_problem(64, 33).find("64 x 33"), std::string::npos);
  EXPECT_NE(mp4_size_problem(16384, 64).find("at most 8192"), std::string::npos);
  const auto rgb = synthetic_video(2, 33, 32);
  EXPECT_THROW(write_mp4_output(path("odd.mp4"), {rgb.data(), 2, 33, 32}, 16), RequestError);
  EXPECT_THROW(write_mp4_output(path("slow.mp4"), {rgb.data(), 2, 32, 32}, 0), RequestError);
  EXPECT_THROW(write_mp4_output(path("fast.mp4"), {rgb.data(), 2, 32, 32}, 241), RequestError);
  EXPECT_TRUE(fs::is_empty(dir_));  // nothing written, no temporary
  EXPECT_GT(mp4_time_limit(81, 720, 1280), 60.0 + 81 * 0.9);
}

TEST_F(VideoOutput, FramePngsWholeAndChecked) {
  const int64_t F = 3, H = 8, W = 10;
  const auto rgb = synthetic_video(F, H, W);
  const fs::path frames = make_output_folders(dir_, "videos/a/x");
  write_frame_pngs(frames, {rgb.data(), F, H, W}, {{"Software", "tprun 1"}, {"prompt", "a fox"}});
  EXPECT_EQ(frame_png_name(7), "frame_00007.png");
  EXPECT_EQ(frame_pngs_problem(frames, F), "");
  for (int64_t f = 0; f < F; ++f) {
    const auto png = pipelines::read_png((frames / frame_png_name(f)).string());
    EXPECT_EQ(png.rgb, std::vector<uint8_t>(rgb.begin() + f * H * W * 3, rgb.begin() + (f + 1) * H * W * 3));
    bool indexed = false;
    for (const auto& [k, v] : png.text) indexed = indexed || (k == "frame" && v == std::to_string(f));
    EXPECT_TRUE(indexed) << f;
  }
  EXPECT_NE(frame_pngs_problem(frames, F + 1).find("frame_00003.png is missing"), std::string::npos);
  const std::string last = (frames / frame_png_name(F - 1)).string();
  const std::string bytes = slurp(last);
  std::ofstream(last, std::ios::binary) << bytes.substr(0, bytes.size() - 5);
  EXPECT_NE(frame_pngs_problem(frames, F).find("is incomplete"), std::string::npos);
  // A user's PNG at a frame's name is never replaced.
  std::ofstream(frames / frame_png_name(0), std::ios::binary) << "not mine to replace";
  EXPECT_THROW(write_frame_pngs(frames, {rgb.data(), F, H, W}, {{"Software", "tprun 1"}}), ConfigError);
  EXPECT_EQ(slurp((frames / frame_png_name(0)).string()), "not mine to replace");
}

// merge-results carries a done request's MP4 and PNG frames (besides its record's file), each checked:
// a chunk whose MP4 was cut short is refused and nothing is merged.
TEST_F(VideoOutput, MergeCarriesVideos) {
  need_ffmpeg();
  const int64_t F = 3, H = 16, W = 16;
  const auto rgb = synthetic_video(F, H, W);
  const fs::path chunk = dir_ / "chunk";
  fs::create_directories(chunk);
  const fs::path frames = make_output_folders(chunk, "videos/v/x");
  write_mp4_output((chunk / mp4_output_rel("v")).string(), {rgb.data(), F, H, W}, 16);
  write_frame_pngs(frames, {rgb.data(), F, H, W}, {{"Software", "tprun 1"}});
  std::ofstream(chunk / "results.jsonl")
      << R"({"id": "v", "status": "done", "path": "videos/v.mp4", "seed": 1, "frames": 3, "fps": 16})" << "\n";
  const MergeSummary s = merge_results({chunk.string()}, (dir_ / "merged").string());
  EXPECT_EQ(s.done, 1);
  EXPECT_EQ(s.files, 1 + F);
  EXPECT_EQ(mp4_incomplete((dir_ / "merged" / mp4_output_rel("v")).string()), "");
  EXPECT_EQ(frame_pngs_problem(dir_ / "merged" / frames_output_rel("v"), F), "");
  const ResultRecord merged = parse_result_record(slurp((dir_ / "merged" / "results.jsonl").string()));
  EXPECT_EQ(merged.path, "videos/v.mp4");
  EXPECT_EQ(merged.fps, 16);
  // Cut short in the chunk: refused, naming the file; --out stays as it was.
  const std::string mp4 = (chunk / mp4_output_rel("v")).string();
  const std::string whole = slurp(mp4);
  std::ofstream(mp4, std::ios::binary | std::ios::trunc) << whole.substr(0, whole.size() - 9);
  std::string e;
  try {
    merge_results({chunk.string()}, (dir_ / "merged2").string());
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("v.mp4"), std::string::npos) << e;
  EXPECT_NE(e.find("is not a complete MP4"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir_ / "merged2"));
}

TEST_F(VideoOutput, ChildProcessBounded) {
  const ChildRun slow = run_child({"sleep", "20"}, nullptr, 0, 0.5);
  EXPECT_TRUE(slow.timed_out);
  EXPECT_LT(slow.seconds, 10.0);
  EXPECT_NE(slow.describe().find("its time limit"), std::string::npos);
  // A program that stops reading: the write fails (no SIGPIPE ends this process), the exit is its own.
  const std::vector<uint8_t> big(8 << 20, 'x');
  const ChildRun early = run_child({"sh", "-c", "exit 3"}, big.data(), big.size(), 30);
  EXPECT_EQ(early.exit_code, 3);
  EXPECT_FALSE(early.ok());
  const ChildRun chatty = run_child({"sh", "-c", "yes"}, nullptr, 0, 30, 1 << 16);
  EXPECT_TRUE(chatty.output_cut);
  EXPECT_LE(chatty.out.size(), size_t{1} << 16);
  const ChildRun echo = run_child({"cat"}, big.data(), big.size(), 30, big.size());
  EXPECT_TRUE(echo.ok()) << echo.describe();
  EXPECT_EQ(echo.out.size(), big.size());
  EXPECT_THROW(run_child({"/nonexistent/tprun-no-such-program"}, nullptr, 0, 5), IoError);
  EXPECT_EQ(find_program("/nonexistent/x"), "");
  EXPECT_NE(find_program("sh"), "");
}

// fps and guidance_2 against an image pipeline's options and a two-expert video pipeline's.
TEST_F(VideoOutput, RequestKeysRefusedByName) {
  pipelines::RequestOptions image;
  image.cls = "FluxPipeline";
  pipelines::RequestOptions video;
  video.cls = "WanPipeline";
  video.max_frames = 1000;
  video.frame_multiple = 4;
  video.default_fps = 16;
  video.accepts_guidance_2 = true;
  auto refused = [](const pipelines::GenerationRequest& r, const pipelines::RequestOptions& o) -> std::string {
    try {
      pipelines::check_request_options(r, o, [](const std::string& key, const std::string& what) {
        throw RequestError(key + ": " + what);
      });
    } catch (const RequestError& e) {
      return e.what();
    }
    return "";
  };
  pipelines::GenerationRequest r;
  r.fps = 8;
  EXPECT_NE(refused(r, image).find("fps: FluxPipeline makes images, not videos"), std::string::npos);
  EXPECT_EQ(refused(r, video), "");
  r.fps = 0;
  EXPECT_NE(refused(r, video).find("fps: 0 is outside [1, 240]"), std::string::npos);
  r = {};
  r.guidance_2 = 3.0;
  EXPECT_NE(refused(r, image).find("guidance_2: FluxPipeline has no second expert"), std::string::npos);
  EXPECT_EQ(refused(r, video), "");
  r.guidance_2 = std::nan("");
  EXPECT_NE(refused(r, video).find("guidance_2:"), std::string::npos);
  // The video pipeline's default rate fills an unset fps; an image pipeline's defaults have none.
  EXPECT_EQ(video.request_defaults({}).fps, std::optional<int64_t>(16));
  EXPECT_FALSE(image.request_defaults({}).fps.has_value());
  pipelines::GenerationRequest given;
  given.fps = 24;
  given.fill_from(video.request_defaults({}));
  EXPECT_EQ(given.fps, std::optional<int64_t>(24));
  // generation_text: fps only with frames above 1, guidance_2 where set.
  pipelines::GenerationRequest g;
  g.fps = 16;
  auto text = pipelines::generation_text(g, "m", "fp32");
  for (const auto& [k, v] : text) EXPECT_NE(k, "fps");
  g.frames = 9;
  g.guidance_2 = 3.0;
  text = pipelines::generation_text(g, "m", "fp32");
  int seen = 0;
  for (const auto& [k, v] : text) seen += (k == "fps" && v == "16") + (k == "guidance_2" && v == "3");
  EXPECT_EQ(seen, 2);
}

TEST_F(VideoOutput, ResultsLogRecordsFpsOfVideosOnly) {
  ResultRecord r;
  r.id = "v";
  r.status = "done";
  r.path = "videos/v.mp4";
  r.frames = 9;
  r.fps = 16;
  const auto j = r.to_json();
  EXPECT_EQ(j["fps"], 16);
  EXPECT_EQ(j["frames"], 9);
  const ResultRecord back = parse_result_record(j.dump());
  EXPECT_EQ(back.fps, 16);
  EXPECT_EQ(back.path, "videos/v.mp4");
  r.frames = 1;
  EXPECT_FALSE(r.to_json().contains("fps"));
  for (const char* bad : {R"({"id": "v", "status": "done", "frames": 9, "fps": 0})",
                          R"({"id": "v", "status": "done", "frames": 9, "fps": 241})",
                          R"({"id": "v", "status": "done", "frames": 9, "fps": 2.5})"}) {
    EXPECT_THROW(parse_result_record(bad), std::runtime_error) << bad;
  }
  EXPECT_EQ(record_path_problem("videos/v/frame_00000.png"), "");
  EXPECT_NE(record_path_problem("videos/../v.mp4"), "");
}

TEST_F(VideoOutput, ManifestVideoFormats) {
  const std::string m = path("job.toml");
  std::ofstream(m) << "model = \"m\"\nrequests = \"r.jsonl\"\n[defaults]\nfps = 24\nguidance_2 = 3.0\n"
                      "[output]\nformats = [\"mp4\", \"frames\"]\n";
  const Manifest man = parse_manifest(m);
  EXPECT_TRUE(man.mp4);
  EXPECT_TRUE(man.frame_pngs);
  EXPECT_FALSE(man.png);
  EXPECT_EQ(man.defaults.fps, std::optional<int64_t>(24));
  EXPECT_EQ(man.defaults.guidance_2, std::optional<double>(3.0));
  pipelines::RequestOptions image;
  image.cls = "FluxPipeline";
  try {
    check_formats(man, image);
    ADD_FAILURE() << "mp4 accepted for an image pipeline";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("output.formats: mp4 is for videos, and FluxPipeline makes images"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_manifest(m, {{"output.formats", "[\"mp5\"]"}}), ConfigError);
  EXPECT_THROW(parse_manifest(m, {{"defaults.fps", "0"}}), ConfigError);
}

}  // namespace
}  // namespace tprun::jobs
