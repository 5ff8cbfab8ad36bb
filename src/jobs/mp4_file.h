#pragma once
// What tprun reads back from an MP4 it wrote, without decoding a frame: the
// ISO-BMFF box structure (is the file whole?) and the comment tag tprun's
// writer puts in (did tprun write it? video_output.h mp4_comment_tag). Torch-free, no FFmpeg: resume, the
// placement rule of output_folder.h and merge-results call it on files a
// user may have put there, so every size read is checked against the file.

#include <cstdint>
#include <string>

namespace tprun::jobs {

struct Mp4Facts {
  std::string comment;          // the ©cmt text ("" when there is none)
  int64_t video_samples = 0;    // samples (frames) of the first video track
  int64_t width = 0, height = 0;  // its track header's size (pixels)
  double fps = 0;               // samples / duration of that track (0 when unknown)
};

// Why the file at `path` is not a complete MP4 ("" when it is):
//  - the top-level boxes tile the file exactly (a box that runs past the end:
//    the file was cut short; bytes after the last box: not one MP4);
//  - `ftyp` comes first; one `moov` and at least one `mdat` are there;
//  - every sample of every track's sample table (stsz sizes, stsc runs,
//    stco/co64 chunk offsets) lies inside an mdat's payload;
//  - a video track with at least one sample.
// `facts`, when given, gets what was read, the comment even from a file
// that is cut short (tprun's writer puts moov before mdat). Reads the box
// headers and moov only (moov at most 64 MiB).
std::string mp4_incomplete(const std::string& path, Mp4Facts* facts = nullptr);

}  // namespace tprun::jobs
