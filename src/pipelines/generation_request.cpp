#include "pipelines/generation_request.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::pipelines {

const RequestBound& request_bound(const std::string& key) {
  static const RequestBound bounds[] = {
      {"height", 1, 16384, true},
      {"width", 1, 16384, true},
      {"steps", 1, 10000, true},
      {"guidance", 0, 1000, false},
      {"true_cfg_scale", 0, 1000, false},
      {"max_sequence_length", 1, static_cast<double>(kMaxSequenceLengthBound), true},
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
}

bool GenerationRequest::has_given(const std::string& name) const { return given && given->count(name) != 0; }

std::vector<std::pair<std::string, std::string>> generation_text(const GenerationRequest& r, const std::string& model,
                                                                  const std::string& dtype) {
  std::vector<std::pair<std::string, std::string>> t = {{"Software", fmt::format("tprun {}", TPRUN_VERSION)},
                                                        {"prompt", r.prompt}};
  if (r.negative_prompt) t.emplace_back("negative_prompt", *r.negative_prompt);
  t.emplace_back("seed", std::to_string(r.seed));
  auto add = [&](const char* key, const auto& value) {
    if (value) t.emplace_back(key, fmt::format("{}", *value));
  };
  add("height", r.height);
  add("width", r.width);
  add("steps", r.steps);
  add("guidance", r.guidance);
  add("true_cfg_scale", r.true_cfg_scale);
  add("max_sequence_length", r.max_sequence_length);
  t.emplace_back("model", model);
  t.emplace_back("dtype", dtype);
  return t;
}

}  // namespace tprun::pipelines
