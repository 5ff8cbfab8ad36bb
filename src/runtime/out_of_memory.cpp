#include "runtime/out_of_memory.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <new>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "runtime/host_memory.h"
#include "runtime/memory_release.h"
#include "runtime/size_string.h"

namespace tprun {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

// Case-insensitive find of `needle` (lower case) in `text` from `from`.
size_t find_icase(std::string_view text, std::string_view needle, size_t from = 0) {
  if (needle.size() > text.size()) return std::string_view::npos;
  for (size_t i = from; i + needle.size() <= text.size(); ++i) {
    size_t k = 0;
    while (k < needle.size() && lower(text[i + k]) == needle[k]) ++k;
    if (k == needle.size()) return i;
  }
  return std::string_view::npos;
}

bool contains_icase(std::string_view text, std::string_view needle) {
  return find_icase(text.substr(0, kOutOfMemoryMessageScan), needle) != std::string_view::npos;
}

// "<number> <unit>" at the start of `s` -> bytes; nullopt if it is not one.
std::optional<uint64_t> parse_amount(std::string_view s) {
  size_t i = 0;
  uint64_t whole = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (whole > (kMax - d) / 10) return std::nullopt;  // beyond 2^64 - 1
    whole = whole * 10 + d;
    ++i;
  }
  if (i == 0) return std::nullopt;  // "more than 1EB"
  double fraction = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    double scale = 0.1;
    for (int digits = 0; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
      if (digits < 18) fraction += scale * (s[i] - '0');
      scale /= 10;
    }
  }
  if (i >= s.size() || s[i] != ' ') return std::nullopt;
  ++i;
  size_t end = i;
  while (end < s.size() && std::isalpha(static_cast<unsigned char>(s[end]))) ++end;
  std::string unit;
  for (size_t k = i; k < end; ++k) unit += lower(s[k]);
  uint64_t mult = 0;
  if (unit == "b" || unit == "byte" || unit == "bytes") mult = 1;
  else if (unit == "kib") mult = uint64_t{1} << 10;
  else if (unit == "mib") mult = uint64_t{1} << 20;
  else if (unit == "gib") mult = uint64_t{1} << 30;
  else if (unit == "tib") mult = uint64_t{1} << 40;
  else return std::nullopt;
  if (whole > kMax / mult) return std::nullopt;
  const uint64_t base = whole * mult;
  const double extra = std::round(fraction * static_cast<double>(mult));
  if (extra > static_cast<double>(kMax - base)) return std::nullopt;
  return base + static_cast<uint64_t>(extra);
}

// What an exception says about a failed allocation.
struct Failure {
  bool out_of_memory = false;
  std::string text;  // the exception's message (no backtrace)
};

bool allocator_text(std::string_view what) {
  return contains_icase(what, "can't allocate memory") || contains_icase(what, "not enough memory") ||
         contains_icase(what, "out of memory") || contains_icase(what, "cannot allocate memory");
}

// `depth` bounds the walk down nested exceptions.
Failure classify(const std::exception_ptr& error, int depth) {
  if (!error) return {};
  try {
    std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError& e) {
    return {true, e.what_without_backtrace()};
  } catch (const c10::Error& e) {
    // torch 2.11's CPU allocator throws a plain c10::Error (CAFFE_ENFORCE).
    std::string what = e.what_without_backtrace();
    return {allocator_text(what), std::move(what)};
  } catch (const std::bad_alloc& e) {
    return {true, e.what()};
  } catch (const Error& e) {
    if (e.kind() == Error::Kind::Device && contains_icase(e.what(), "cudaerrormemoryallocation")) {
      return {true, e.what()};
    }
    const auto* nested = dynamic_cast<const std::nested_exception*>(&e);
    if (nested != nullptr && depth < 4) {
      Failure inner = classify(nested->nested_ptr(), depth + 1);
      if (inner.out_of_memory) return inner;
    }
    return {};
  } catch (...) {
    return {};
  }
}

// The first line of an allocator's message, bounded for a log line.
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, std::min(text.find('\n'), kOutOfMemoryMessageScan));
  return clip_text(line, 320);
}

// "cuda:3" -> 3; -1 for anything else.
int cuda_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 9) return -1;
  int n = 0;
  for (size_t i = 5; i < device.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(device[i]))) return -1;
    n = n * 10 + (device[i] - '0');
  }
  return n;
}

// ", which has 1.10 GiB free of 139.72 GiB now" (CUDA) or ", 3.00 GiB available
// there now (RLIMIT_AS (ulimit -v))" (host); empty where nothing can be read.
// Rounded (format_bytes): the asked amount is the exact one.
std::string memory_now(const std::string& device) {
  const int index = cuda_index(device);
  if (index >= 0) {
    const HostMemory m = device_memory(index);
    if (m.limits.empty()) return {};
    const MemoryLimit& l = m.limits.front();
    return fmt::format(", which has {} free of {} now", format_bytes(l.available), format_bytes(l.limit));
  }
  if (device.rfind("cuda", 0) == 0) return {};
  const HostMemory m = host_memory();
  const MemoryLimit* tight = m.tightest();
  if (tight == nullptr) return {};
  return fmt::format(", {} available there now ({})", format_bytes(tight->available), tight->name);
}

}  // namespace

std::optional<uint64_t> parse_requested_bytes(std::string_view message) {
  const std::string_view head = message.substr(0, kOutOfMemoryMessageScan);
  constexpr std::string_view kPhrase = "tried to allocate ";  // both allocators' wording
  for (size_t at = find_icase(head, kPhrase); at != std::string_view::npos;
       at = find_icase(head, kPhrase, at + 1)) {
    if (auto bytes = parse_amount(head.substr(at + kPhrase.size()))) return bytes;
  }
  return std::nullopt;
}

bool is_out_of_memory(const std::exception_ptr& error) { return classify(error, 0).out_of_memory; }

RequestError out_of_memory_error(const std::exception_ptr& error, const std::string& request,
                                 const std::string& device) {
  if (!error) throw Error(Error::Kind::Internal, "out_of_memory_error called without an exception");
  const Failure failure = classify(error, 0);
  if (!failure.out_of_memory) std::rethrow_exception(error);
  // What the failed request held is free now: give it back before the next
  // request (and before reading what is free).
  release_free_memory();
  const auto bytes = parse_requested_bytes(failure.text);
  return RequestError(fmt::format(
      "{} ran out of memory while generating (asked for {} on {}{}; {}); try a smaller height/width or "
      "batch_size, a larger tp (the activations split over the group), [memory] vae_tiling = true, "
      "attention_chunk, offload or fp8 storage (layerwise_casting), or `tprun plan` to size the job",
      request, bytes ? format_size(*bytes) : std::string("an unknown amount"), device, memory_now(device),
      first_line(failure.text)));
}

}  // namespace tprun
