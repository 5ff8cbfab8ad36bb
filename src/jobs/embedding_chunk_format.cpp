#include "jobs/embedding_chunk_format.h"

#include <algorithm>
#include <new>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::jobs {

namespace {

std::string to_hex(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

EntryHash::EntryHash() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(state_);
}

EntryHash::~EntryHash() { XXH3_freeState(state_); }

void EntryHash::raw(const void* data, size_t n) {
  if (n > 0) XXH3_128bits_update(state_, data, n);
}

void EntryHash::number(uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  raw(b, 8);
}

void EntryHash::field(const std::string& s) {
  number(s.size());
  raw(s.data(), s.size());
}

void EntryHash::tensor(const std::string& name, checkpoint::Dtype dtype, const std::vector<int64_t>& shape,
                       uint64_t nbytes) {
  field(name);
  field(checkpoint::dtype_name(dtype));
  number(shape.size());
  for (int64_t d : shape) number(static_cast<uint64_t>(d));
  number(nbytes);
}

std::string EntryHash::hex() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

// The keys as a JSON array: a string for a UTF-8 key, {"hex": ...} otherwise
// (JSON strings hold only UTF-8).
std::string encode_keys(const std::vector<std::pair<std::string, models::TensorMap>>& entries) {
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& [key, tensors] : entries) {
    nlohmann::json k = key;
    try {
      (void)k.dump();
    } catch (const nlohmann::json::type_error&) {
      k = {{"hex", to_hex(key)}};
    }
    keys.push_back(std::move(k));
  }
  return keys.dump();
}

std::vector<std::string> decode_keys(const std::string& text, const std::string& file) {
  const nlohmann::json keys = parse_strict_json(text, file, "the embedding keys");
  if (!keys.is_array()) throw CheckpointError(fmt::format("{}: __metadata__ '{}' is not a JSON array", file, kKeysKey));
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) {
    if (k.is_string()) {
      out.push_back(k.get<std::string>());
      continue;
    }
    const bool hex_object = k.is_object() && k.size() == 1 && k.contains("hex") && k["hex"].is_string();
    const std::string hex = hex_object ? k["hex"].get<std::string>() : std::string("?");
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size() && hex.size() % 2 == 0; i += 2) {
      const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
      if (hi < 0 || lo < 0) break;
      bytes.push_back(static_cast<char>(hi * 16 + lo));
    }
    if (bytes.size() * 2 != hex.size()) {
      throw CheckpointError(fmt::format("{}: key {} is neither a string nor {{\"hex\": \"<lowercase hex>\"}}", file,
                                        out.size()));
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

std::vector<std::string> decode_hashes(const std::string& text, size_t keys, const std::string& file) {
  const nlohmann::json hashes = parse_strict_json(text, file, "the embedding hashes");
  if (!hashes.is_array() || hashes.size() != keys) {
    throw CheckpointError(fmt::format("{}: __metadata__ '{}' is not a JSON array of one hash for each of its {} keys",
                                      file, kHashesKey, keys));
  }
  std::vector<std::string> out;
  for (const auto& h : hashes) {
    const std::string s = h.is_string() ? h.get<std::string>() : std::string();
    if (s.size() != 32 || !std::all_of(s.begin(), s.end(), [](char c) { return hex_digit(c) >= 0; }))
      throw CheckpointError(fmt::format("{}: hash {} is not 32 lowercase hex digits", file, out.size()));
    out.push_back(s);
  }
  return out;
}

// "<i>/<name>" -> (i, name); CheckpointError unless i is a key's index.
std::pair<size_t, std::string> split_tensor_name(const std::string& tensor, size_t keys, const std::string& file) {
  const size_t slash = tensor.find('/');
  const std::string digits = tensor.substr(0, slash);
  const bool number = slash != std::string::npos && !digits.empty() && digits.size() <= 9 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                      (digits == "0" || digits[0] != '0');
  const size_t index = number ? std::stoul(digits) : keys;
  if (index >= keys) {
    throw CheckpointError(fmt::format("{}: tensor '{}' is not '<key index>/<name>' for one of its {} keys", file,
                                      clip_text(tensor), keys));
  }
  return {index, tensor.substr(slash + 1)};
}

}  // namespace tprun::jobs
