#include "pipelines/png_image.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>

#include <fmt/format.h>
#include <png.h>
#include <zlib.h>

#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace fs = std::filesystem;

namespace {

// libpng reports errors through a callback that must not return: it records
// the message here and longjmps back to the setjmp of the calling step. The
// steps that hold a setjmp (write_steps, read_header, read_pixels) keep only
// plain C locals, so the jump skips no destructor.
struct PngFailure {
  char message[256] = {0};
  int err = 0;  // errno when libpng gave up (a failed write: ENOSPC, EFBIG, EIO)
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* failure = static_cast<PngFailure*>(png_get_error_ptr(png));
  if (failure != nullptr) {
    failure->err = errno;
    std::snprintf(failure->message, sizeof(failure->message), "%s", message);
  }
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

// ---- text chunks ------------------------------------------------------------

// The Latin-1 bytes of `value` when every character may appear in a tEXt
// chunk (printable Latin-1 or newline); otherwise false (iTXt is used).
bool latin1_text(const std::u32string& code_points, std::string& out) {
  out.clear();
  for (char32_t c : code_points) {
    const bool printable = c == '\n' || (c >= 0x20 && c <= 0x7E) || (c >= 0xA1 && c <= 0xFF);
    if (!printable) return false;
    out.push_back(static_cast<char>(static_cast<unsigned char>(c)));
  }
  return true;
}

void check_keyword(const std::string& key, const std::string& path) {
  bool ok = !key.empty() && key.size() <= 79 && key.front() != ' ' && key.back() != ' ' &&
            key.find("  ") == std::string::npos;
  for (char ch : key) ok = ok && ch >= 0x20 && ch <= 0x7E;
  if (!ok) {
    throw RequestError(fmt::format("{}: PNG text keyword '{}' is not 1-79 printable ASCII characters without "
                                   "leading, trailing or double spaces",
                                   path, key));
  }
}

// Text chunks prepared before libpng runs; png_text points into `storage`
// (a deque: its strings never move).
struct PreparedText {
  std::deque<std::string> storage;
  std::vector<png_text> chunks;
};

void prepare_text(const PngText& text, const std::string& path, PreparedText& out) {
  std::string latin1;
  for (const auto& [key, value] : text) {
    check_keyword(key, path);
    // libpng measures tEXt and iTXt text with strlen: a NUL would end the
    // stored text early, and the metadata would disagree with the image.
    if (value.find('\0') != std::string::npos) {
      throw RequestError(fmt::format("{}: PNG text '{}' holds a NUL character (at byte {}), which PNG text cannot "
                                     "carry",
                                     path, key, value.find('\0')));
    }
    const std::u32string code_points = text::decode_utf8(value, fmt::format("{}: PNG text '{}'", path, key));
    png_text t;
    std::memset(&t, 0, sizeof(t));
    out.storage.push_back(key);
    t.key = out.storage.back().data();
    if (latin1_text(code_points, latin1)) {
      t.compression = PNG_TEXT_COMPRESSION_NONE;
      out.storage.push_back(latin1);
      t.text = out.storage.back().data();
      t.text_length = out.storage.back().size();
    } else {
      t.compression = PNG_ITXT_COMPRESSION_NONE;
      out.storage.push_back(value);
      t.text = out.storage.back().data();
      t.itxt_length = out.storage.back().size();
      t.lang = nullptr;
      t.lang_key = nullptr;
    }
    out.chunks.push_back(t);
  }
}

// ---- writing ------------------------------------------------------------------

bool write_steps(png_structp png, png_infop info, std::FILE* file, int width, int height, png_bytep* rows,
                 png_textp text, int num_text) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, file);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (num_text > 0) png_set_text(png, info, text, num_text);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, info);
  return true;
}

// A temporary file next to the destination, removed unless committed.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path) {
    const fs::path p(path);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    std::string pattern = (dir / ("." + p.filename().string() + ".tmp-XXXXXX")).string();
    const int fd = ::mkstemp(pattern.data());
    if (fd < 0) throw_io_error(fmt::format("cannot create a temporary file in {} for", dir.string()), path, errno);
    tmp_ = pattern;
    file_ = ::fdopen(fd, "wb");
    if (file_ == nullptr) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp_.c_str());
      throw_io_error("cannot open a temporary file for", path, err);
    }
  }
  ~TempFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  std::FILE* file() { return file_; }

  void commit() {
    if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) throw_io_error("cannot write", path_, errno);
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) throw_io_error("cannot close", path_, errno);
    ::chmod(tmp_.c_str(), 0644);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw_io_error("cannot rename the temporary file to", path_, errno);
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// ---- reading ------------------------------------------------------------------

bool read_header(png_structp png, png_infop info, std::FILE* file) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, file);
  png_set_user_limits(png, 1u << 16, 1u << 16);
  png_read_info(png, info);
  png_set_expand(png);  // palette -> RGB, grey < 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  return true;
}

bool read_pixels(png_structp png, png_infop info, png_bytep* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  png_read_end(png, info);
  return true;
}

std::string latin1_to_utf8(const char* s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

}  // namespace

void write_png(const std::string& path, const uint8_t* rgb, int width, int height, const PngText& text_chunks) {
  if (rgb == nullptr || width <= 0 || height <= 0 || width > (1 << 16) || height > (1 << 16))
    throw RequestError(fmt::format("{}: cannot write a {}x{} PNG{}", path, width, height,
                                   rgb == nullptr ? " without pixels" : " (sizes must be 1..65536)"));
  PreparedText text;
  prepare_text(text_chunks, path, text);
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int y = 0; y < height; ++y)
    rows[static_cast<size_t>(y)] = const_cast<png_bytep>(rgb + static_cast<size_t>(y) * width * 3);

  TempFile tmp(path);
  PngFailure failure;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &failure, on_png_error, on_png_warning);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr) {
    png_destroy_write_struct(&png, &info);
    throw CheckpointError(fmt::format("{}: libpng could not start a PNG writer (out of memory?)", path));
  }
  errno = 0;  // so that a failure's errno is the write's own
  const bool ok = write_steps(png, info, tmp.file(), width, height, rows.data(), text.chunks.data(),
                              static_cast<int>(text.chunks.size()));
  png_destroy_write_struct(&png, &info);
  if (!ok) {
    if (failure.err != 0) throw_io_error(fmt::format("cannot write the PNG (libpng: {})", failure.message), path, failure.err);
    throw IoError(fmt::format("cannot write the PNG: {}: libpng: {}", path, failure.message));
  }
  tmp.commit();
}

PngImage read_png(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  unsigned char signature[8] = {0};
  if (std::fread(signature, 1, 8, file) != 8 || png_sig_cmp(signature, 0, 8) != 0) {
    std::fclose(file);
    throw CheckpointError(fmt::format("{}: not a PNG file (bad signature)", path));
  }
  PngFailure failure;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &failure, on_png_error, on_png_warning);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  auto fail = [&](const std::string& what) {
    png_destroy_read_struct(&png, &info, nullptr);
    std::fclose(file);
    throw CheckpointError(fmt::format("{}: {}: {}", path, what, failure.message));
  };
  if (png == nullptr || info == nullptr) fail("libpng could not start a PNG reader");
  png_set_sig_bytes(png, 8);
  if (!read_header(png, info, file)) fail("malformed PNG header");

  PngImage image;
  image.width = static_cast<int>(png_get_image_width(png, info));
  image.height = static_cast<int>(png_get_image_height(png, info));
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8 ||
      row_bytes != static_cast<size_t>(image.width) * 3) {
    std::snprintf(failure.message, sizeof(failure.message), "%d channels of %d bits", png_get_channels(png, info),
                  png_get_bit_depth(png, info));
    fail("cannot convert the image to 8-bit RGB");
  }
  image.rgb.resize(row_bytes * static_cast<size_t>(image.height));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y) rows[static_cast<size_t>(y)] = image.rgb.data() + row_bytes * y;
  if (!read_pixels(png, info, rows.data())) fail("malformed PNG data");

  png_textp text = nullptr;
  const int num_text = png_get_text(png, info, &text, nullptr);
  for (int i = 0; i < num_text; ++i) {
    const png_text& t = text[i];
    const bool utf8 = t.compression == PNG_ITXT_COMPRESSION_NONE || t.compression == PNG_ITXT_COMPRESSION_zTXt;
    const size_t n = utf8 ? t.itxt_length : t.text_length;
    image.text.emplace_back(latin1_to_utf8(t.key, std::strlen(t.key)),
                            utf8 ? std::string(t.text, n) : latin1_to_utf8(t.text, n));
  }
  png_destroy_read_struct(&png, &info, nullptr);
  std::fclose(file);
  return image;
}

// ---- completeness (resume) ------------------------------------------------------

std::string png_incomplete(const std::string& path, std::string* software) {
  if (software != nullptr) software->clear();
  // fopen() opens a folder for reading, and reading it then fails: say what it is instead.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return S_ISDIR(st.st_mode) ? "a folder, not a file" : "not a regular file";
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return fmt::format("cannot open: {}", std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  static const unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  unsigned char head[8];
  if (std::fread(head, 1, 8, f) != 8) return "shorter than a PNG signature";
  if (std::memcmp(head, kSignature, 8) != 0) return "no PNG signature";
  bool first = true;
  std::vector<unsigned char> buf(1 << 16);
  for (int64_t at = 8;;) {  // chunks: length (4, big-endian), type (4), data, CRC (4) of type and data
    unsigned char ch[8];
    if (std::fread(ch, 1, 8, f) != 8) return "truncated: no IEND chunk";
    const uint32_t length = (uint32_t{ch[0]} << 24) | (uint32_t{ch[1]} << 16) | (uint32_t{ch[2]} << 8) | ch[3];
    const std::string type(reinterpret_cast<const char*>(ch + 4), 4);
    const std::string name = clip_text(type);
    if (length > 0x7FFFFFFFu) return fmt::format("chunk '{}' at byte {} has a bad length", name, at);
    if (first && type != "IHDR") return "the first chunk is not IHDR";
    first = false;
    // Every chunk's CRC: a flipped bit inside IDAT leaves the structure whole.
    uLong crc = crc32(0L, ch + 4, 4);
    const bool keep = software != nullptr && type == "tEXt" && length <= 4096;
    std::string text;
    for (uint32_t left = length; left > 0;) {
      const size_t n = std::fread(buf.data(), 1, std::min<size_t>(left, buf.size()), f);
      if (n == 0) return type == "IEND" ? "truncated inside the IEND chunk" : "truncated inside a chunk";
      crc = crc32(crc, buf.data(), static_cast<uInt>(n));
      if (keep) text.append(reinterpret_cast<const char*>(buf.data()), n);
      left -= static_cast<uint32_t>(n);
    }
    unsigned char stored[4];
    if (std::fread(stored, 1, 4, f) != 4) {
      return type == "IEND" ? "truncated inside the IEND chunk" : "truncated inside a chunk";
    }
    const uint32_t want =
        (uint32_t{stored[0]} << 24) | (uint32_t{stored[1]} << 16) | (uint32_t{stored[2]} << 8) | stored[3];
    if (static_cast<uint32_t>(crc) != want) {
      return fmt::format("chunk '{}' at byte {} has a bad CRC (the file is damaged)", name, at);
    }
    static const std::string kSoftwareKey("Software\0", 9);
    if (keep && text.rfind(kSoftwareKey, 0) == 0) *software = text.substr(kSoftwareKey.size());
    if (type == "IEND") return "";
    at += int64_t{12} + length;
  }
}

}  // namespace tprun::pipelines
