// libFuzzer target: config.json through the torch-free bounds layer every
// model family reads its config with (models/model_config.h): typed fields,
// plausible caps, block counts against the checkpoint's tensor names
// (TensorCensus) and overflow-checked products. The families' own readers
// and the model tables they record link libtorch, which this clang++ build
// does not; tests/unit/test_model_builder.cpp drives hostile values through
// every family's table instead.
//
// Input: a config.json text, then a line "--", then tensor names one per line.
// The config is parsed strictly (as read_component_config does); then every
// integer field (top level and one object deep) is read as a size under each
// cap, as a block count against the census under every prefix the names
// suggest, and in products with the others; every list as a list of sizes.
// Only a tprun::CheckpointError naming the file is an acceptable failure; a
// value that is returned must be within its bounds, and TensorCensus::blocks
// must agree with a plain recount. Per input: bounded time and memory
// (run_fuzzer.sh -timeout / -rss_limit_mb, tighter for this target).
// Seeds: tests/fuzz/corpus/model_config (tests/fuzz/make_hostile.py writes them).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "models/model_config.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace {

using namespace tprun::models;
using nlohmann::json;

const std::string kPath = "/fuzz/config.json";

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "INVARIANT BROKEN: %s\n", what.c_str());
  std::abort();
}

void accept(const tprun::CheckpointError& e, const std::string& field) {
  const std::string m = e.what();
  if (m.find(kPath) == std::string::npos) broken("error without the file: " + m);
  if (!field.empty() && m.find(field) == std::string::npos) broken("error without the field '" + field + "': " + m);
}

// The plain recount TensorCensus::blocks must agree with.
int64_t recount(const std::vector<std::string>& names, const std::string& prefix) {
  std::set<std::string> seen;
  const std::string head = prefix + ".";
  for (const auto& n : names) {
    if (n.compare(0, head.size(), head) != 0) continue;
    const size_t dot = n.find('.', head.size());
    const std::string index = n.substr(head.size(), dot == std::string::npos ? std::string::npos : dot - head.size());
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos) seen.insert(index);
  }
  return static_cast<int64_t>(seen.size());
}

// Every prefix before an all-digit component ("a.b" for "a.b.3.w"), at most 16.
std::vector<std::string> prefixes_of(const std::vector<std::string>& names) {
  std::set<std::string> out;
  for (const auto& n : names) {
    size_t start = 0;
    while (start < n.size() && out.size() < 16) {
      size_t dot = n.find('.', start);
      if (dot == std::string::npos) dot = n.size();
      if (start > 0 && dot > start && n.find_first_not_of("0123456789", start) >= dot) out.insert(n.substr(0, start - 1));
      start = dot + 1;
    }
  }
  out.insert("blocks");
  return {out.begin(), out.end()};
}

void sizes(const json& c, const std::string& path, const TensorCensus& census, const std::vector<std::string>& names,
           const std::vector<std::string>& prefixes) {
  std::vector<std::pair<std::string, int64_t>> factors;
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string field = it.key();
    if (it->is_array()) {
      try {
        for (int64_t v : config_int_list_or(c, field, path, {}, 8, kMaxConfigWidth)) {
          if (v < 1 || v > kMaxConfigWidth) broken("list entry out of bounds in " + field);
        }
      } catch (const tprun::CheckpointError& e) {
        accept(e, field);
      }
      continue;
    }
    if (!it->is_number()) continue;
    for (int64_t cap : {kMaxConfigHeads, kMaxConfigWidth, kMaxConfigDim}) {
      try {
        const int64_t v = config_positive(c, field, path, 1, cap);
        if (v < 1 || v > cap) broken("config_positive out of bounds: " + field);
        if (cap == kMaxConfigDim && factors.size() < 6) factors.emplace_back(field, v);
      } catch (const tprun::CheckpointError& e) {
        accept(e, field);
      }
    }
    for (const auto& prefix : prefixes) {
      const int64_t held = census.blocks(prefix);
      if (held != recount(names, prefix)) broken("TensorCensus::blocks disagrees with a recount under " + prefix);
      for (int64_t extra : {0, 1}) {
        try {
          const int64_t v = config_block_count(c, field, path, 0, &census, {prefix}, 0, extra);
          if (v < 0 || v > kMaxConfigLayers || v > std::max<int64_t>(held - extra, 0)) {
            broken("block count beyond the census or the cap: " + field);
          }
        } catch (const tprun::CheckpointError& e) {
          accept(e, field);
        }
      }
    }
  }
  try {
    const int64_t p = config_product(path, factors, kMaxConfigWidth);
    __int128 exact = 1;
    for (const auto& f : factors) exact *= f.second;
    if (p != exact || p > kMaxConfigWidth) broken("config_product is not the exact, bounded product");
  } catch (const tprun::CheckpointError& e) {
    accept(e, factors.empty() ? std::string() : factors.front().first);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t sep = input.find("\n--\n");
  const std::string_view config_text = input.substr(0, sep);
  std::vector<std::string> names;
  if (sep != std::string_view::npos) {
    size_t start = sep + 4;
    while (start < input.size() && names.size() < 4096) {
      size_t nl = input.find('\n', start);
      if (nl == std::string_view::npos) nl = input.size();
      if (nl > start) names.emplace_back(input.substr(start, nl - start));
      start = nl + 1;
    }
  }
  json c;
  try {
    c = tprun::parse_strict_json(config_text, kPath, "config.json");
  } catch (const tprun::CheckpointError& e) {
    accept(e, "");
    return 0;
  }
  if (!c.is_object()) {
    try {
      config_int_or_null(c, "num_layers", kPath);
      broken("a config that is not an object was read");
    } catch (const tprun::CheckpointError& e) {
      accept(e, "");
    }
    return 0;
  }
  const TensorCensus census(names, "/fuzz");
  const std::vector<std::string> prefixes = prefixes_of(names);
  sizes(c, kPath, census, names, prefixes);
  for (auto it = c.begin(); it != c.end(); ++it) {
    if (it->is_object()) sizes(*it, kPath + " (" + it.key() + ")", census, names, prefixes);
  }
  return 0;
}
