#pragma once
// Strict TOML documents through toml++: every key known, every value of its
// type and range, and every message naming where the value came from:
// "<file>:<line>: <key>" for a file, "<flag> <key>" ("--set defaults.steps",
// "--memory vae_tiling") for a command-line setting applied to the document
// before it is read. The job manifest (jobs/manifest.h) and the [memory]
// table (memory/memory_table.h) are read with it. Torch-free; every file that
// uses toml++ includes it through this header.

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

// toml++'s internal assertions are off in every build, as in a release build
// (NDEBUG): 3.3 asserts on some malformed headers ("[\n[x]") that its parser
// then reports as ordinary parse errors.
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

namespace tprun {

// key=value, the key dotted ("defaults.steps", "memory.vae_tiling").
using TomlOverride = std::pair<std::string, std::string>;

// A parsed document's name and the keys set from the command line.
struct TomlDoc {
  TomlDoc(std::string path_, std::string flag_, std::string flag_prefix_ = "")
      : path(std::move(path_)), flag(std::move(flag_)), flag_prefix(std::move(flag_prefix_)) {}

  std::string path;                  // the file, in "<file>:<line>: <key>"
  std::set<std::string> overridden;  // dotted keys set from the command line
  // The flag that set them, and the key prefix it leaves out ("--memory
  // vae_tiling" for memory.vae_tiling).
  std::string flag;
  std::string flag_prefix;

  std::string flag_key(const std::string& key) const;
  // "<file>:<line>: <key>", or "<flag> <key>" for a key the command line set.
  std::string where(const std::string& key, const toml::node& node) const;
  // ConfigError (every rank) "<where>: <what>".
  [[noreturn]] void fail(const std::string& key, const toml::node& node, const std::string& what) const;
};

// "a table", "an integer", ... for messages.
const char* toml_type_name(const toml::node& n);

// Field readers: each checks the type and the range, naming where and the key.
struct FieldReader {
  const TomlDoc& doc;
  std::string prefix;  // "defaults." or ""

  std::string key(const std::string& k) const { return prefix + k; }
  std::string str(const std::string& k, const toml::node& n) const;
  int64_t integer(const std::string& k, const toml::node& n, int64_t lo, int64_t hi) const;
  double number(const std::string& k, const toml::node& n, double lo, double hi) const;
  bool boolean(const std::string& k, const toml::node& n) const;
};

using FieldHandler = std::function<void(const FieldReader&, const std::string&, const toml::node&)>;

// Runs the handler of every key of `table` (in the table's order); an unknown
// key is an error that lists the known ones ("<prefix><key>", sorted).
void walk_table(const TomlDoc& doc, const toml::table& table, const std::string& prefix,
                const std::map<std::string, FieldHandler>& handlers);

// `n` as a table, else an error "must be a table ([key]), found ...".
const toml::table& table_at(const TomlDoc& doc, const std::string& key, const toml::node& n);

// `text` parsed; ConfigError "<path>:<line>:<column>: <what>" for a syntax
// error, or naming the line of a character toml++ must not see (below).
toml::table parse_toml_document(const std::string& text, const std::string& path);

// Sets the dotted key of `o` in `root` (creating the tables on its way) to its
// value read as TOML; a value that is not TOML is taken as a string (so
// `--set model=/data/m` works). Records the key in doc.overridden.
void apply_override(toml::table& root, const TomlOverride& o, TomlDoc& doc);

// toml++ 3.3 (Debian 12) reaches __builtin_unreachable() in its Unicode
// whitespace test for some non-ASCII code points outside strings (e.g.
// U+02C9), which is undefined behaviour. TOML allows non-ASCII text only in
// strings and comments, so such input is refused before toml++ sees it
// (ConfigError "<where>:<line>: ..."); likewise control characters outside
// strings (TOML forbids them; toml++ 3.3 asserts on some, e.g. "[\r\0").
void refuse_non_ascii_outside_strings(const std::string& text, const std::string& where);

}  // namespace tprun
