#include "jobs/request_list.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/file_kind.h"
#include "runtime/strict_json.h"

namespace tprun::jobs {
namespace {

[[noreturn]] void fail(const std::string& file, int64_t line, const std::string& field, const std::string& what) {
  throw ConfigError(fmt::format("{}:{}: {}: {}", file, line, field, what), true);
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

uint64_t derive_seed(uint64_t base, const std::string& id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  uint64_t z = base ^ h;  // SplitMix64 finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z & ((uint64_t{1} << 53) - 1);
}

namespace {

// The value readers of one request line: each names file:line and the field.
struct LineReader {
  const std::string& file;
  int64_t line;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    jobs::fail(file, line, field, what);
  }
  int64_t integer(const std::string& k, const nlohmann::json& v, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(k, fmt::format("must be an integer, found {}", clip_text(v.dump())));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      fail(k, fmt::format("{} is outside [{}, {}]", clip_text(v.dump()), lo, hi));
    }
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(k, fmt::format("{} is outside [{}, {}]", x, lo, hi));
    return x;
  }
  double number(const std::string& k, const nlohmann::json& v, double lo, double hi) const {
    if (!v.is_number()) fail(k, fmt::format("must be a number, found {}", clip_text(v.dump())));
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      // An integer as written (INT64_MAX, not its double 9.223372036854776e+18).
      const std::string shown = v.is_number_integer() ? v.dump() : fmt::format("{}", x);
      fail(k, fmt::format("{} is outside [{}, {}]", clip_text(shown), lo, hi));
    }
    return x;
  }
  // Within the bound every request is held to (pipelines::request_bound).
  int64_t bounded_integer(const std::string& k, const nlohmann::json& v) const {
    const pipelines::RequestBound& b = pipelines::request_bound(k);
    return integer(k, v, static_cast<int64_t>(b.lo), static_cast<int64_t>(b.hi));
  }
  double bounded_number(const std::string& k, const nlohmann::json& v) const {
    const pipelines::RequestBound& b = pipelines::request_bound(k);
    return number(k, v, b.lo, b.hi);
  }
  std::string string(const std::string& k, const nlohmann::json& v) const {
    if (!v.is_string()) fail(k, fmt::format("must be a string, found {}", clip_text(v.dump())));
    return v.get<std::string>();
  }
  std::string id(const std::string& k, const nlohmann::json& v) const {
    std::string id;
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
      id = std::to_string(v.get<uint64_t>());
    } else if (v.is_string()) {
      id = v.get<std::string>();
    } else {
      fail(k, fmt::format("must be a string or a non-negative integer, found {}", clip_text(v.dump())));
    }
    if (!valid_id(id)) {
      fail(k, fmt::format("'{}' is not a valid id (letters, digits, '.', '_', '-'; at most 128; not starting with '.')",
                          clip_text(id)));
    }
    return id;
  }
  uint64_t seed(const std::string& k, const nlohmann::json& v) const {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      fail(k, fmt::format("must be a non-negative integer, found {}", clip_text(v.dump())));
    }
    return v.get<uint64_t>();
  }
};

// The line as one JSON object.
nlohmann::json parse_line_object(const LineReader& in, const std::string& text) {
  nlohmann::json j;
  try {
    j = parse_strict_json(text, in.file, fmt::format("line {}", in.line));
  } catch (const Error& e) {
    in.fail("json", e.what());
  }
  if (!j.is_object()) in.fail("json", "each line must be one JSON object");
  return j;
}

// "loras": an array of {"path", "scale"} objects, each path resolved by `resolve`.
void read_loras(const LineReader& in, const nlohmann::json& v, const LoraResolver& resolve, JobRequest& r) {
  if (!v.is_array()) {
    in.fail("loras", fmt::format("must be an array of {{\"path\": ..., \"scale\": ...}} objects ([] = none), found {}",
                                 clip_text(v.dump())));
  }
  if (v.size() > lora::kMaxLorasPerRequest) {
    in.fail("loras", fmt::format("{} adapters, more than {} (the most one request stacks)", v.size(),
                                 lora::kMaxLorasPerRequest));
  }
  std::vector<lora::LoraChoice> set;
  std::vector<std::string> written;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string entry = fmt::format("loras[{}]", i);
    const nlohmann::json& e = v[i];
    if (!e.is_object()) {
      in.fail(entry, fmt::format("must be an object {{\"path\": ..., \"scale\": ...}}, found {}", clip_text(e.dump())));
    }
    lora::LoraChoice c;
    bool have_path = false;
    for (const auto& [k, x] : e.items()) {
      const std::string field = entry + "." + clip_text(k);
      if (k == "path") {
        c.path = in.string(field, x);
        have_path = true;
      } else if (k == "scale") {
        c.scale = in.number(field, x, -lora::kMaxLoraScale, lora::kMaxLoraScale);
      } else {
        in.fail(field, "unknown field (known: path, scale)");
      }
    }
    if (!have_path) in.fail(entry + ".path", "required field is missing");
    const std::string field = entry + ".path";
    if (c.path.empty()) in.fail(field, "is empty: name a .safetensors file");
    written.push_back(c.path);
    if (resolve) {
      std::string resolved;
      const std::string why = resolve(c.path, resolved);
      if (!why.empty()) in.fail(field, fmt::format("{} {}", clip_text(c.path, 400), why));
      c.path = resolved;
    }
    for (size_t j = 0; j < set.size(); ++j) {
      if (set[j].path == c.path) {
        in.fail(field, fmt::format("{} is listed twice (also loras[{}]): give it once, with the scales summed",
                                   clip_text(written.back(), 400), j));
      }
    }
    set.push_back(std::move(c));
  }
  r.gen.loras = std::move(set);
  r.lora_written = std::move(written);
  r.own_loras = true;
}

// Which of the fields that need a second look a line set.
struct FieldsSeen {
  bool prompt = false;
  bool negative_prompt = false;
};

// One field of the line into `r`; an unknown field is an error listing the known ones.
void read_field(const LineReader& in, const std::string& k, const nlohmann::json& v, JobRequest& r, FieldsSeen& seen,
                const LoraResolver& resolve_lora) {
  auto& g = r.gen;
  if (k == "id") {
    r.id = in.id(k, v);
  } else if (k == "prompt") {
    g.prompt = in.string(k, v);
    seen.prompt = true;
  } else if (k == "negative_prompt") {
    const std::string s = in.string(k, v);
    seen.negative_prompt = true;  // "" = none, even where the manifest has a default
    if (!s.empty()) g.negative_prompt = s;
  } else if (k == "height") {
    g.height = in.bounded_integer(k, v);
  } else if (k == "width") {
    g.width = in.bounded_integer(k, v);
  } else if (k == "steps") {
    g.steps = in.bounded_integer(k, v);
  } else if (k == "guidance") {
    g.guidance = in.bounded_number(k, v);
  } else if (k == "true_cfg_scale") {
    g.true_cfg_scale = in.bounded_number(k, v);
  } else if (k == "max_sequence_length") {
    g.max_sequence_length = in.bounded_integer(k, v);
  } else if (k == "frames") {
    g.frames = in.bounded_integer(k, v);
  } else if (k == "fps") {
    g.fps = in.bounded_integer(k, v);
  } else if (k == "guidance_2") {
    g.guidance_2 = in.bounded_number(k, v);
  } else if (k == "seed") {
    g.seed = in.seed(k, v);
    r.seed_given = true;
  } else if (k == "loras") {
    read_loras(in, v, resolve_lora, r);
  } else {
    in.fail(clip_text(k),
            "unknown field (known: id, prompt, negative_prompt, height, width, steps, guidance, guidance_2, "
            "true_cfg_scale, max_sequence_length, frames, fps, seed, loras)");
  }
}

}  // namespace

JobRequest parse_request_line(const std::string& text, const std::string& file, int64_t line,
                              const pipelines::GenerationRequest& d, const LoraResolver& resolve_lora) {
  const LineReader in{file, line};
  const nlohmann::json j = parse_line_object(in, text);
  JobRequest r;
  r.line = line;
  FieldsSeen seen;
  for (const auto& [k, v] : j.items()) read_field(in, k, v, r, seen, resolve_lora);
  if (r.id.empty()) in.fail("id", "required field is missing");
  if (!seen.prompt) in.fail("prompt", "required field is missing");
  auto& g = r.gen;
  if (!r.seed_given) g.seed = derive_seed(d.seed, r.id);
  g.id = r.id;  // the pipeline names the request in its warnings
  const std::optional<std::string> negative = g.negative_prompt;
  g.fill_from(d);
  if (seen.negative_prompt) g.negative_prompt = negative;
  return r;
}

void check_requests_file(const std::string& manifest, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      throw ConfigError(fmt::format("{}: requests: {}: no such file", manifest, path), true);
    }
    throw ConfigError(fmt::format("{}: requests: {}: {}", manifest, path, std::strerror(errno)), true);
  }
  if (S_ISDIR(st.st_mode)) {
    throw ConfigError(fmt::format("{}: requests: {} is a directory, not a JSONL file", manifest, path), true);
  }
  if (!S_ISREG(st.st_mode)) {
    const char* what = special_file_kind(st.st_mode);
    throw ConfigError(
        fmt::format("{}: requests: {} is not a regular file ({}); give a JSONL file", manifest, path, what), true);
  }
  if (::access(path.c_str(), R_OK) != 0) {
    throw ConfigError(fmt::format("{}: requests: {}: cannot read: {}", manifest, path, std::strerror(errno)), true);
  }
}

std::vector<JobRequest> read_requests(const std::string& path, const pipelines::GenerationRequest& defaults,
                                      const LoraResolver& resolve_lora) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the requests file", path), true);
  std::vector<JobRequest> out;
  std::unordered_map<std::string, int64_t> first_line;
  std::string text;
  int64_t line = 0;
  // Lines are read with a bound: one over kMaxRequestLine bytes is an error,
  // never a read of the whole file into one string.
  while (in) {
    text.clear();
    char c = 0;
    bool any = false;
    while (in.get(c)) {
      any = true;
      if (c == '\n') break;
      if (text.size() >= kMaxRequestLine) {
        fail(path, line + 1, "json", fmt::format("the line is longer than {} bytes", kMaxRequestLine));
      }
      text.push_back(c);
    }
    if (in.bad()) throw ConfigError(fmt::format("{}: cannot read the requests file after line {}", path, line), true);
    if (!any) break;
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    size_t p = text.find_first_not_of(" \t");
    if (p == std::string::npos || text[p] == '#') continue;
    JobRequest r = parse_request_line(text, path, line, defaults, resolve_lora);
    auto [it, fresh] = first_line.emplace(r.id, line);
    if (!fresh) fail(path, line, "id", fmt::format("'{}' is used twice (first on line {})", clip_text(r.id), it->second));
    out.push_back(std::move(r));
  }
  if (out.empty()) throw ConfigError(fmt::format("{}: the requests file holds no request", path), true);
  return out;
}

}  // namespace tprun::jobs
