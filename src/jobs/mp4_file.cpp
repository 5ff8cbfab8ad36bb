// ISO-BMFF (ISO/IEC 14496-12) read just far enough to say whether an MP4 is
// whole and who wrote it. See mp4_file.h.
#include "jobs/mp4_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace tprun::jobs {
namespace {

constexpr uint64_t kMaxMoov = uint64_t{64} << 20;
constexpr int kMaxTopBoxes = 100000;

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
uint64_t be64(const uint8_t* p) { return (uint64_t{be32(p)} << 32) | be32(p + 4); }

// A box inside a byte range: its type, payload start and payload size.
struct Box {
  std::string type;
  uint64_t start = 0;  // of the box
  uint64_t payload = 0;
  uint64_t size = 0;   // of the whole box
};

// The boxes of bytes [begin, end) of an in-memory buffer, or nullopt where
// one does not fit (a malformed moov).
std::optional<std::vector<Box>> children(const std::string& b, uint64_t begin, uint64_t end) {
  std::vector<Box> out;
  uint64_t at = begin;
  while (at < end) {
    if (end - at < 8 || out.size() > 100000) return std::nullopt;
    const auto* p = reinterpret_cast<const uint8_t*>(b.data() + at);
    uint64_t size = be32(p);
    uint64_t header = 8;
    if (size == 1) {
      if (end - at < 16) return std::nullopt;
      size = be64(p + 8);
      header = 16;
    } else if (size == 0) {
      size = end - at;
    }
    if (size < header || size > end - at) return std::nullopt;
    out.push_back({std::string(b.data() + at + 4, 4), at, at + header, size});
    at += size;
  }
  return out;
}

const Box* find(const std::vector<Box>& boxes, const char* type) {
  for (const auto& x : boxes)
    if (x.type == type) return &x;
  return nullptr;
}

// One track's sample table checked against the mdat payloads.
struct Range {
  uint64_t begin, end;
};

bool inside(const std::vector<Range>& mdats, uint64_t off, uint64_t size) {
  for (const auto& r : mdats) {
    if (off >= r.begin && off <= r.end && size <= r.end - off) return true;
  }
  return false;
}

class MoovReader {
 public:
  MoovReader(const std::string& moov, std::vector<Range> mdats, Mp4Facts& facts)
      : b_(moov), mdats_(std::move(mdats)), facts_(facts) {}

  // "" or why not.
  std::string read() {
    auto top = children(b_, 0, b_.size());
    if (!top) return "its moov box is malformed (a box inside it does not fit)";
    read_comment(*top);
    bool video = false;
    for (const Box& t : *top) {
      if (t.type != "trak") continue;
      const std::string why = read_track(t, video);
      if (!why.empty()) return why;
    }
    if (!video) return "it holds no video track with a frame";
    return "";
  }

 private:
  const uint8_t* at(uint64_t off) const { return reinterpret_cast<const uint8_t*>(b_.data() + off); }

  void read_comment(const std::vector<Box>& top) {
    const Box* udta = find(top, "udta");
    if (!udta) return;
    auto u = children(b_, udta->payload, udta->start + udta->size);
    const Box* meta = u ? find(*u, "meta") : nullptr;
    if (!meta || meta->start + meta->size - meta->payload < 4) return;
    auto m = children(b_, meta->payload + 4, meta->start + meta->size);  // a full box: version and flags first
    const Box* ilst = m ? find(*m, "ilst") : nullptr;
    if (!ilst) return;
    auto items = children(b_, ilst->payload, ilst->start + ilst->size);
    if (!items) return;
    for (const Box& item : *items) {
      if (item.type != "\xa9" "cmt") continue;
      auto d = children(b_, item.payload, item.start + item.size);
      const Box* data = d ? find(*d, "data") : nullptr;
      if (!data || data->start + data->size - data->payload < 8) return;
      const uint64_t text = data->payload + 8;  // type indicator, locale
      facts_.comment.assign(b_.data() + text, data->start + data->size - text);
      return;
    }
  }

  std::optional<std::vector<Box>> sub(const std::vector<Box>& boxes, const char* type) const {
    const Box* x = find(boxes, type);
    if (!x) return std::nullopt;
    return children(b_, x->payload, x->start + x->size);
  }

  std::string read_track(const Box& trak, bool& video) {
    auto t = children(b_, trak.payload, trak.start + trak.size);
    if (!t) return "a track box is malformed";
    auto mdia = sub(*t, "mdia");
    if (!mdia) return "a track has no media box (mdia)";
    const Box* hdlr = find(*mdia, "hdlr");
    const bool is_video = hdlr && hdlr->size >= hdlr->payload - hdlr->start + 12 &&
                          std::string(b_.data() + hdlr->payload + 8, 4) == "vide";
    auto minf = sub(*mdia, "minf");
    auto stbl = minf ? sub(*minf, "stbl") : std::nullopt;
    if (!stbl) return "a track has no sample table (stbl)";
    int64_t samples = 0;
    const std::string why = check_samples(*stbl, samples);
    if (!why.empty()) return why;
    if (is_video && samples > 0 && !video) {
      video = true;
      facts_.video_samples = samples;
      if (const Box* tkhd = find(*t, "tkhd"); tkhd && tkhd->start + tkhd->size - tkhd->payload >= 84) {
        const uint64_t end = tkhd->start + tkhd->size;  // width, height: the last 8 bytes, 16.16 fixed point
        facts_.width = be32(at(end - 8)) >> 16;
        facts_.height = be32(at(end - 4)) >> 16;
      }
      if (const Box* mdhd = find(*mdia, "mdhd"); mdhd && mdhd->start + mdhd->size - mdhd->payload >= 24) {
        const uint8_t* p = at(mdhd->payload);
        const bool v1 = p[0] == 1 && mdhd->start + mdhd->size - mdhd->payload >= 36;
        const uint64_t scale = v1 ? be32(p + 20) : be32(p + 12);
        const uint64_t duration = v1 ? be64(p + 24) : be32(p + 16);
        if (scale > 0 && duration > 0) facts_.fps = static_cast<double>(samples) * scale / static_cast<double>(duration);
      }
    }
    return "";
  }

  // Every sample (stsz) placed by chunk (stsc, stco/co64) inside an mdat.
  std::string check_samples(const std::vector<Box>& stbl, int64_t& samples) {
    const Box* stsz = find(stbl, "stsz");
    const Box* stsc = find(stbl, "stsc");
    const Box* stco = find(stbl, "stco");
    const Box* co64 = find(stbl, "co64");
    if (!stsz || !stsc || (!stco && !co64)) return "a track's sample table lacks stsz, stsc or its chunk offsets";
    auto payload = [](const Box* x) { return x->start + x->size - x->payload; };
    if (payload(stsz) < 12) return "a track's stsz box is cut short";
    const uint32_t uniform = be32(at(stsz->payload + 4));
    const uint64_t count = be32(at(stsz->payload + 8));
    if (uniform == 0 && payload(stsz) < 12 + 4 * count) return "a track's stsz box lists more samples than it holds";
    if (payload(stsc) < 8) return "a track's stsc box is cut short";
    const uint64_t runs = be32(at(stsc->payload + 4));
    if (payload(stsc) < 8 + 12 * runs) return "a track's stsc box lists more runs than it holds";
    const Box* co = co64 ? co64 : stco;
    const uint64_t width = co64 ? 8 : 4;
    if (payload(co) < 8) return "a track's chunk offset box is cut short";
    const uint64_t chunks = be32(at(co->payload + 4));
    if (payload(co) < 8 + width * chunks) return "a track's chunk offset box lists more chunks than it holds";
    uint64_t sample = 0;
    for (uint64_t c = 0; c < chunks && sample < count; ++c) {
      // The run that covers chunk c + 1 (runs are 1-based and ascending).
      uint64_t per_chunk = 0;
      for (uint64_t r = 0; r < runs; ++r) {
        const uint64_t first = be32(at(stsc->payload + 8 + 12 * r));
        if (first > c + 1) break;
        per_chunk = be32(at(stsc->payload + 8 + 12 * r + 4));
      }
      uint64_t off = co64 ? be64(at(co->payload + 8 + 8 * c)) : be32(at(co->payload + 8 + 4 * c));
      for (uint64_t k = 0; k < per_chunk && sample < count; ++k, ++sample) {
        const uint64_t size = uniform != 0 ? uniform : be32(at(stsz->payload + 12 + 4 * sample));
        if (!inside(mdats_, off, size)) {
          return fmt::format("sample {} ({} bytes at offset {}) lies outside its media data (mdat): the file was cut "
                             "short or damaged",
                             sample, size, off);
        }
        off += size;
      }
    }
    if (sample < count) return fmt::format("its sample table places {} of {} samples", sample, count);
    samples = static_cast<int64_t>(count);
    return "";
  }

  const std::string& b_;
  std::vector<Range> mdats_;
  Mp4Facts& facts_;
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::string mp4_incomplete(const std::string& path, Mp4Facts* facts) {
  Mp4Facts local;
  Mp4Facts& f = facts ? *facts : local;
  f = Mp4Facts{};
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) return "cannot be opened";
  struct stat st {};
  if (::fstat(::fileno(file.get()), &st) != 0 || !S_ISREG(st.st_mode)) return "is not a regular file";
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return "is empty";
  std::vector<Range> mdats;
  std::string moov;
  bool have_moov = false, first = true;
  std::string cut;  // why the top level does not tile the file
  uint64_t at = 0;
  for (int n = 0; at < size; ++n) {
    if (n >= kMaxTopBoxes) return fmt::format("holds more than {} top-level boxes", kMaxTopBoxes);
    uint8_t h[16];
    if (size - at < 8 || std::fseek(file.get(), static_cast<long>(at), SEEK_SET) != 0 ||
        std::fread(h, 1, 8, file.get()) != 8) {
      cut = fmt::format("it ends inside a box header at byte {}: cut short", at);
      break;
    }
    uint64_t box = be32(h);
    uint64_t header = 8;
    const std::string type(reinterpret_cast<const char*>(h + 4), 4);
    if (box == 1) {
      if (size - at < 16 || std::fread(h + 8, 1, 8, file.get()) != 8) {
        cut = fmt::format("it ends inside the '{}' box header at byte {}: cut short", type, at);
        break;
      }
      box = be64(h + 8);
      header = 16;
    } else if (box == 0) {
      box = size - at;  // "to the end of the file"
    }
    if (first && type != "ftyp") return "does not start with an ftyp box: not an MP4";
    first = false;
    if (box < header) return fmt::format("its '{}' box at byte {} has a size smaller than its header", type, at);
    if (box > size - at) {
      cut = fmt::format("its '{}' box at byte {} runs {} bytes past the end of the file: cut short", type, at,
                        box - (size - at));
    }
    if (type == "mdat") mdats.push_back({at + header, std::min(at + box, size)});
    if (type == "moov" && !have_moov) {
      if (box - header > kMaxMoov) return fmt::format("its moov box is larger than {} bytes", kMaxMoov);
      const uint64_t avail = std::min(box, size - at) - header;
      moov.resize(avail);
      if (avail > 0 && std::fread(moov.data(), 1, avail, file.get()) != avail) return "cannot be read";
      have_moov = true;
    }
    if (!cut.empty()) break;
    at += box;
  }
  if (have_moov) {
    MoovReader reader(moov, mdats, f);  // the comment first, from whatever moov holds
    const std::string why = reader.read();
    if (cut.empty() && !why.empty()) return why;
  }
  if (!cut.empty()) return cut;
  if (!have_moov) return "has no moov box (the writer never finished it)";
  if (mdats.empty()) return "has no media data (mdat) box";
  return "";
}

}  // namespace tprun::jobs
