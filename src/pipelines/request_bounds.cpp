// The bounds of a request's numeric values (request_bound, check_request_bounds): torch-free, so
// the manifest and request parsers and their fuzz target share them.
#include <fmt/format.h>

#include "pipelines/generation_request.h"
#include "runtime/error.h"

namespace tprun::pipelines {

const RequestBound& request_bound(const std::string& key) {
  static const RequestBound bounds[] = {
      {"height", 1, static_cast<double>(kMaxImageSide), true},
      {"width", 1, static_cast<double>(kMaxImageSide), true},
      {"steps", 1, 10000, true},
      {"guidance", 0, 1000, false},
      {"true_cfg_scale", 0, 1000, false},
      {"max_sequence_length", 1, static_cast<double>(kMaxSequenceLengthBound), true},
      {"frames", 1, static_cast<double>(kMaxFrames), true},
      {"fps", 1, static_cast<double>(kMaxFps), true},
      {"guidance_2", 0, 1000, false},
  };
  for (const auto& b : bounds) {
    if (key == b.key) return b;
  }
  throw Error(Error::Kind::Internal, fmt::format("no request bound for '{}'", key));
}

std::string outside_bound(const RequestBound& b, double value) {
  return fmt::format("{} is outside [{}, {}]", value, b.lo, b.hi);
}

std::string outside_bound(const RequestBound& b, int64_t value) {
  return fmt::format("{} is outside [{}, {}]", value, static_cast<int64_t>(b.lo), static_cast<int64_t>(b.hi));
}

void check_request_bounds(const GenerationRequest& r, const RequestFail& fail) {
  auto integer = [&](const char* key, const std::optional<int64_t>& v) {
    if (!v) return;
    const RequestBound& b = request_bound(key);
    if (static_cast<double>(*v) < b.lo || static_cast<double>(*v) > b.hi) fail(key, outside_bound(b, *v));
  };
  auto number = [&](const char* key, const std::optional<double>& v) {
    if (!v) return;
    const RequestBound& b = request_bound(key);
    if (!(*v >= b.lo && *v <= b.hi)) fail(key, outside_bound(b, *v));  // NaN too
  };
  integer("height", r.height);
  integer("width", r.width);
  integer("steps", r.steps);
  number("guidance", r.guidance);
  number("true_cfg_scale", r.true_cfg_scale);
  integer("max_sequence_length", r.max_sequence_length);
  integer("frames", r.frames);
  integer("fps", r.fps);
  number("guidance_2", r.guidance_2);
}

}  // namespace tprun::pipelines
