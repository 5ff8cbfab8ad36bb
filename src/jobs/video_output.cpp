#include "jobs/video_output.h"

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "jobs/mp4_file.h"
#include "jobs/output_folder.h"
#include "pipelines/generation_request.h"
#include "pipelines/png_image.h"
#include "runtime/child_process.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

std::string mp4_comment_tag() { return fmt::format("tprun {}", TPRUN_VERSION); }

std::string ffmpeg_program() {
  const char* named = std::getenv("TPRUN_FFMPEG");
  return find_program(named != nullptr && *named != '\0' ? named : "ffmpeg");
}

std::string mp4_writer_problem() {
  static std::mutex mu;
  static std::string checked_program, verdict;
  static bool checked = false;
  std::lock_guard<std::mutex> lock(mu);
  const std::string program = ffmpeg_program();
  if (checked && program == checked_program) return verdict;
  checked = true;
  checked_program = program;
  const char* named = std::getenv("TPRUN_FFMPEG");
  if (program.empty()) {
    verdict = named != nullptr && *named != '\0'
                  ? fmt::format("TPRUN_FFMPEG names '{}', which is not an executable program", clip_text(named))
                  : "MP4 videos are written by the ffmpeg program, and there is none on PATH: install it "
                    "(Debian: apt-get install ffmpeg; tools/setup.sh does) or set TPRUN_FFMPEG, or drop the mp4 format "
                    "(frames and hdf5 need no program)";
    return verdict;
  }
  ChildRun run;
  try {
    run = run_child({program, "-hide_banner", "-loglevel", "error", "-encoders"}, nullptr, 0, 30.0);
  } catch (const Error& e) {
    verdict = fmt::format("the ffmpeg program {} cannot be run: {}", program, e.what());
    return verdict;
  }
  if (!run.ok()) {
    verdict = fmt::format("the ffmpeg program {} failed to list its encoders ({})", program, run.describe());
  } else if (run.out.find(" libx264 ") == std::string::npos) {
    verdict = fmt::format("the ffmpeg program {} has no libx264 encoder (H.264), which tprun's MP4s use: install an "
                          "ffmpeg built with it (Debian's is)",
                          program);
  } else {
    verdict = "";
  }
  return verdict;
}

std::string mp4_size_problem(int64_t height, int64_t width) {
  if (height % 2 != 0 || width % 2 != 0) {
    return fmt::format("an MP4 (H.264, yuv420p) needs an even height and width, and the result is {} x {}; tprun "
                       "neither pads nor crops it: ask for an even size (or use the frames or hdf5 format)",
                       height, width);
  }
  if (height > kMaxMp4Side || width > kMaxMp4Side) {
    return fmt::format("an MP4 side is at most {} pixels (H.264's largest level), and the result is {} x {}; use the "
                       "frames or hdf5 format",
                       kMaxMp4Side, height, width);
  }
  return "";
}

double mp4_time_limit(int64_t frames, int64_t height, int64_t width) {
  return 60.0 + 2.0 * static_cast<double>(frames) * static_cast<double>(height) * static_cast<double>(width) / 1e6;
}

namespace {

std::vector<std::string> encode_args(const std::string& program, const VideoFrames& v, int64_t fps,
                                     const std::string& out) {
  return {program, "-hide_banner", "-nostats", "-loglevel", "error",
          // The frames as rawvideo on stdin, at the request's rate.
          "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", fmt::format("{}x{}", v.width, v.height), "-framerate",
          std::to_string(fps), "-i", "pipe:0", "-an",
          // H.264 in yuv420p (what every player reads), BT.709 limited range and tagged so, so a decoder
          // converts it back as it was made; crf 18: close to the frames tprun decoded.
          "-c:v", "libx264", "-preset", "medium", "-crf", "18", "-pix_fmt", "yuv420p", "-vf",
          "scale=out_color_matrix=bt709:out_range=tv", "-colorspace", "bt709", "-color_primaries", "bt709",
          "-color_trc", "bt709", "-color_range", "tv",
          // moov first (the tag stays readable in a file cut short); tprun's tag.
          // file: so no part of the path is read as a protocol name ("a:b" folders).
          "-movflags", "+faststart", "-metadata", "comment=" + mp4_comment_tag(), "-f", "mp4", "-y", "file:" + out};
}

}  // namespace

void write_mp4_output(const std::string& path, const VideoFrames& v, int64_t fps) {
  if (const std::string why = mp4_size_problem(v.height, v.width); !why.empty()) {
    throw RequestError(fmt::format("cannot write {}: {}", clip_text(path, 400), why), true);
  }
  if (fps < 1 || fps > pipelines::kMaxFps) {
    throw RequestError(fmt::format("cannot write {}: fps {} is outside [1, {}]", clip_text(path, 400), fps,
                                   pipelines::kMaxFps),
                       true);
  }
  if (v.frames < 1 || v.frames > pipelines::kMaxFrames || v.rgb == nullptr) {
    throw Error(Error::Kind::Internal, fmt::format("write_mp4_output {}: {} frames", path, v.frames));
  }
  if (const std::string why = mp4_writer_problem(); !why.empty()) {
    throw ConfigError(fmt::format("cannot write {}: {}", clip_text(path, 400), why));
  }
  OutputTemp tmp(path);
  const size_t bytes = static_cast<size_t>(v.frames * v.height * v.width * 3);
  const double limit = mp4_time_limit(v.frames, v.height, v.width);
  const ChildRun run = run_child(encode_args(ffmpeg_program(), v, fps, tmp.path()), v.rgb, bytes, limit, 1 << 20);
  if (!run.ok()) {
    throw IoError(fmt::format("cannot write {}: ffmpeg failed ({}; time limit {:.0f} s)", clip_text(path, 400),
                              run.describe(), limit));
  }
  Mp4Facts facts;
  const std::string bad = mp4_incomplete(tmp.path(), &facts);
  if (!bad.empty() || facts.comment != mp4_comment_tag() || facts.video_samples != v.frames) {
    throw IoError(fmt::format("cannot write {}: what ffmpeg wrote is not the video asked for ({}; tag '{}', {} of {} "
                              "frames)",
                              clip_text(path, 400), bad.empty() ? "whole" : bad, clip_text(facts.comment),
                              facts.video_samples, v.frames));
  }
  tmp.place(OutputKind::Mp4);
}

std::string frame_png_name(int64_t f) { return fmt::format("frame_{:05d}.png", f); }

void write_frame_pngs(const fs::path& dir, const VideoFrames& v,
                      const std::vector<std::pair<std::string, std::string>>& text) {
  const int64_t frame_bytes = v.height * v.width * 3;
  for (int64_t f = 0; f < v.frames; ++f) {
    auto t = text;
    t.emplace_back("frame", std::to_string(f));
    write_png_output((dir / frame_png_name(f)).string(), v.rgb + f * frame_bytes, static_cast<int>(v.width),
                     static_cast<int>(v.height), 1, t);
  }
}

std::string frame_pngs_problem(const fs::path& dir, int64_t frames) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec))) return fmt::format("{} is not a folder", dir.string());
  for (int64_t f = 0; f < frames; ++f) {
    const fs::path p = dir / frame_png_name(f);
    if (!fs::is_regular_file(fs::symlink_status(p, ec))) return fmt::format("{} is missing", p.string());
    const std::string why = pipelines::png_incomplete(p.string());
    if (!why.empty()) return fmt::format("{} is incomplete ({})", p.string(), why);
  }
  return "";
}

}  // namespace tprun::jobs
