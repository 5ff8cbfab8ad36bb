#pragma once
// A frame-sequence result ([F, H, W, 3] uint8, frame after frame) written as
// a video: an MP4 (H.264 in yuv420p, made by the `ffmpeg` program, as
// diffusers' export_to_video makes it through imageio-ffmpeg) and a folder of
// PNG frames. docs/video.md says why the program and not FFmpeg's libraries
// (licences: tprun links no GPL code) and what each check refuses.
//
// Both go in as output_folder.h places files: a temporary name in the target
// folder, then a race-free rename that never replaces a file tprun did not
// write (an MP4 is tprun's when its comment tag is mp4_comment_tag()).

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tprun::jobs {

struct VideoFrames {
  const uint8_t* rgb = nullptr;  // frames * height * width * 3 bytes
  int64_t frames = 0, height = 0, width = 0;
};

// A job's video outputs, relative to its output folder: videos/<id>.mp4 and
// the folder videos/<id> of PNG frames.
inline std::string mp4_output_rel(const std::string& id) { return "videos/" + id + ".mp4"; }
inline std::string frames_output_rel(const std::string& id) { return "videos/" + id; }

// The comment tag tprun writes into every MP4 (moov/udta/meta/ilst "©cmt"):
// "tprun <version>". output_folder.h counts an MP4 whose tag starts with
// "tprun " as tprun's.
std::string mp4_comment_tag();

// The largest side of an MP4 tprun writes: H.264's level 6.2 allows 8192 x
// 4320; libx264 refuses beyond 16384, and players beyond 8192.
constexpr int64_t kMaxMp4Side = 8192;

// The ffmpeg program tprun runs: $TPRUN_FFMPEG when set (a path or a name on
// PATH), else `ffmpeg` on PATH; "" when there is none.
std::string ffmpeg_program();
// Why MP4s cannot be written here ("" when they can): no ffmpeg program, or
// one without the libx264 encoder (asked once per process: `ffmpeg
// -encoders`, 30 s at most). Said with what to do (install ffmpeg, or drop
// the mp4 format).
std::string mp4_writer_problem();

// Why a result of `frames` frames of height x width cannot go into an MP4
// ("" when it can): an odd height or width (yuv420p keeps one chroma sample
// per 2 x 2 pixels; tprun refuses rather than pads or crops the frames: a
// request asks for an even size), or a side beyond kMaxMp4Side.
std::string mp4_size_problem(int64_t height, int64_t width);

// The seconds write_mp4_output allows ffmpeg: 60 + 2 per million pixels of
// all frames (libx264's medium preset encodes some tens of million pixels a
// second on one core).
double mp4_time_limit(int64_t frames, int64_t height, int64_t width);

// Encodes `v` at `fps` frames per second (1-240) into a temporary next to
// `path` (`-movflags +faststart`: moov before mdat, so the tag is read even
// from a file cut short), checks what ffmpeg wrote (mp4_incomplete: whole,
// tprun's tag, v.frames frames), then places it (OutputKind::Mp4).
// RequestError naming the path for mp4_size_problem and a bad fps;
// IoError naming the path with ffmpeg's exit and stderr tail when it fails
// or runs past mp4_time_limit (no temporary is left); ConfigError when a
// user's file is at `path` (never replaced).
void write_mp4_output(const std::string& path, const VideoFrames& v, int64_t fps);

// "frame_00000.png": frame `f`'s file in a frames folder.
std::string frame_png_name(int64_t f);

// Every frame as a PNG in the folder `dir` (made as make_output_folders
// makes folders: never through a symlink), frame_png_name(f), each with
// `text` plus its "frame" index, placed as write_png_output places a PNG
// (a file there that tprun did not write ends the write: ConfigError).
void write_frame_pngs(const std::filesystem::path& dir, const VideoFrames& v,
                      const std::vector<std::pair<std::string, std::string>>& text);

// Why the frames folder `dir` does not hold `frames` whole PNG frames ("" when
// it does): for resume and merge-results.
std::string frame_pngs_problem(const std::filesystem::path& dir, int64_t frames);

}  // namespace tprun::jobs
