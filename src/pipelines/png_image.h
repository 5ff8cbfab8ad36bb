#pragma once
// 8-bit RGB PNG files with text chunks (the prompt, seed, model, ...), through
// libpng. Writes are atomic: a temporary file in the same folder, fsync,
// rename; a failed write leaves neither a half-written PNG nor a temporary.
// Values that are Latin-1 go into tEXt chunks, others (UTF-8) into iTXt.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tprun::pipelines {

using PngText = std::vector<std::pair<std::string, std::string>>;  // keyword -> value (UTF-8)

// `rgb`: height rows of width RGB triples, top row first. Keywords must be
// 1-79 printable ASCII characters without leading, trailing or double spaces
// (PNG's rule, narrowed to ASCII). Throws tprun::Error naming `path`:
// RequestError for bad arguments (sizes, keywords, a NUL in a value), IoError
// for a failed write (with the errno text: a full disk, no permission),
// CheckpointError when libpng cannot start a writer. Replaces an existing
// file at `path`.
void write_png(const std::string& path, const uint8_t* rgb, int width, int height, const PngText& text_chunks);

struct PngImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3
  PngText text;              // tEXt, zTXt and iTXt chunks in file order, values as UTF-8
};

// Reads any PNG libpng can read (converted to 8-bit RGB: palette expanded,
// alpha dropped, 16-bit stripped, grey replicated). Throws CheckpointError
// naming `path` for a missing or malformed file.
PngImage read_png(const std::string& path);

// Why the PNG file at `path` is not complete ("" when it is): a regular file,
// the signature, IHDR first, every chunk within the file with a matching CRC,
// an IEND chunk that ends inside the file. Reads every byte, decodes nothing.
// For resume and merge-results: a truncated, empty or damaged image recorded
// `done` runs again (is refused). When `software` is given, it receives the
// text of a tEXt "Software" chunk ("tprun <version>" in the images tprun
// writes; "" when there is none).
std::string png_incomplete(const std::string& path, std::string* software = nullptr);

}  // namespace tprun::pipelines
