#include "runtime/strict_toml.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"

namespace tprun {

std::string TomlDoc::flag_key(const std::string& key) const {
  const bool strip = !flag_prefix.empty() && key.rfind(flag_prefix, 0) == 0;
  return fmt::format("{} {}", flag, strip ? key.substr(flag_prefix.size()) : key);
}

std::string TomlDoc::where(const std::string& key, const toml::node& node) const {
  if (overridden.count(key)) return flag_key(key);
  // A key inside a table the flag set ("--memory layerwise_casting={...}").
  for (const auto& o : overridden) {
    if (key.size() > o.size() && key.compare(0, o.size(), o) == 0 && key[o.size()] == '.') return flag_key(key);
  }
  // A table the flag created on the way to its key ("--set a.b.c.d=1"
  // makes a, a.b, a.b.c; none is in the file): the flag and its full key.
  if (node.source().begin.line == 0) {
    for (const auto& o : overridden) {
      if (o.size() > key.size() && o.compare(0, key.size(), key) == 0 && o[key.size()] == '.') return flag_key(o);
    }
  }
  return fmt::format("{}:{}: {}", path, node.source().begin.line, key);
}

void TomlDoc::fail(const std::string& key, const toml::node& node, const std::string& what) const {
  throw ConfigError(fmt::format("{}: {}", where(key, node), what), true);
}

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string FieldReader::str(const std::string& k, const toml::node& n) const {
  if (!n.is_string()) doc.fail(key(k), n, fmt::format("must be a string, found {}", toml_type_name(n)));
  return n.as_string()->get();
}

int64_t FieldReader::integer(const std::string& k, const toml::node& n, int64_t lo, int64_t hi) const {
  if (!n.is_integer()) doc.fail(key(k), n, fmt::format("must be an integer, found {}", toml_type_name(n)));
  const int64_t v = n.as_integer()->get();
  if (v < lo || v > hi) doc.fail(key(k), n, fmt::format("{} is outside [{}, {}]", v, lo, hi));
  return v;
}

double FieldReader::number(const std::string& k, const toml::node& n, double lo, double hi) const {
  double v = 0;
  if (n.is_integer()) {
    v = static_cast<double>(n.as_integer()->get());
  } else if (n.is_floating_point()) {
    v = n.as_floating_point()->get();
  } else {
    doc.fail(key(k), n, fmt::format("must be a number, found {}", toml_type_name(n)));
  }
  if (!(v >= lo && v <= hi)) {
    // An integer as written (INT64_MAX, not its double 9.223372036854776e+18).
    const std::string shown = n.is_integer() ? std::to_string(n.as_integer()->get()) : fmt::format("{}", v);
    doc.fail(key(k), n, fmt::format("{} is outside [{}, {}]", shown, lo, hi));
  }
  return v;
}

bool FieldReader::boolean(const std::string& k, const toml::node& n) const {
  if (!n.is_boolean()) doc.fail(key(k), n, fmt::format("must be true or false, found {}", toml_type_name(n)));
  return n.as_boolean()->get();
}

void walk_table(const TomlDoc& doc, const toml::table& table, const std::string& prefix,
                const std::map<std::string, FieldHandler>& handlers) {
  FieldReader r{doc, prefix};
  for (const auto& [k, node] : table) {
    const std::string name(k.str());
    auto it = handlers.find(name);
    if (it == handlers.end()) {
      std::vector<std::string> known;
      for (const auto& [h, _] : handlers) known.push_back(prefix + h);
      doc.fail(prefix + name, node, fmt::format("unknown key (known: {})", fmt::join(known, ", ")));
    }
    it->second(r, name, node);
  }
}

const toml::table& table_at(const TomlDoc& doc, const std::string& key, const toml::node& n) {
  if (!n.is_table()) doc.fail(key, n, fmt::format("must be a table ([{}]), found {}", key, toml_type_name(n)));
  return *n.as_table();
}

toml::table parse_toml_document(const std::string& text, const std::string& path) {
  refuse_non_ascii_outside_strings(text, path);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column,
                                  e.description()),
                      true);
  }
}

void apply_override(toml::table& root, const TomlOverride& o, TomlDoc& doc) {
  const std::string& dotted = o.first;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    parts.push_back(dotted.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts) {
    if (p.empty()) throw ConfigError(fmt::format("{}: empty key component", doc.flag_key(dotted)), true);
  }
  toml::table* t = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = t->get(parts[i]);
    if (!n) {
      t->insert(parts[i], toml::table{});
      n = t->get(parts[i]);
    }
    if (!n->is_table()) {
      throw ConfigError(fmt::format("{}: '{}' is not a table", doc.flag_key(dotted), parts[i]), true);
    }
    t = n->as_table();
  }
  // The value as TOML; a bare word that is not TOML is a string.
  toml::table parsed;
  try {
    refuse_non_ascii_outside_strings("v = " + o.second, doc.flag_key(dotted));
    parsed = toml::parse("v = " + o.second);
  } catch (const std::exception&) {
    parsed = toml::table{};
    parsed.insert("v", o.second);
  }
  t->insert_or_assign(parts.back(), *parsed.get("v"));
  doc.overridden.insert(dotted);
}

void refuse_non_ascii_outside_strings(const std::string& text, const std::string& where) {
  int64_t line = 1;
  size_t i = 0;
  const size_t n = text.size();
  auto starts = [&](const char* s) { return text.compare(i, std::strlen(s), s) == 0; };
  while (i < n) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (c == '#') {
      while (i < n && text[i] != '\n') ++i;
    } else if (starts("\"\"\"") || starts("\'\'\'")) {
      const std::string close = text.substr(i, 3);
      i += 3;
      while (i < n && !starts(close.c_str())) {
        if (text[i] == '\n') ++line;
        if (close[0] == '"' && text[i] == '\\') ++i;
        ++i;
      }
      i += 3;
    } else if (c == '"' || c == '\'') {
      ++i;
      while (i < n && text[i] != c && text[i] != '\n') {
        if (c == '"' && text[i] == '\\') ++i;
        ++i;
      }
      ++i;
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      throw ConfigError(fmt::format("{}:{}: a non-ASCII character outside a string or comment", where, line), true);
    } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && !(c == '\r' && i + 1 < n && text[i + 1] == '\n')) ||
               c == 0x7f) {
      throw ConfigError(fmt::format("{}:{}: a control character (0x{:02x}) outside a string", where, line,
                                    static_cast<unsigned>(static_cast<unsigned char>(c))),
                        true);
    } else {
      ++i;
    }
  }
}

}  // namespace tprun
