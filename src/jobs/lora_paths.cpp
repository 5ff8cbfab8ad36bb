// The adapter path rule (lora_paths.h): stat-only checks, canonical paths,
// the folders a request's adapters may come from.
#include "jobs/lora_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "jobs/output_folder.h"
#include "lora/lora_file_check.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

// The canonical form of an existing path, or "" (with `why`) when it cannot be had.
std::string canonical_of(const std::string& path, std::string& why) {
  std::error_code ec;
  const fs::path c = fs::canonical(path, ec);
  if (ec) {
    why = ec.message();
    return "";
  }
  return c.string();
}

// The manifest's folder, canonical (the current folder for a bare file name).
std::string manifest_folder(const Manifest& m) {
  std::error_code ec;
  const fs::path abs = fs::absolute(m.path, ec).parent_path();
  const fs::path c = fs::canonical(abs, ec);
  return (ec ? abs.lexically_normal() : c).string();
}

}  // namespace


void resolve_manifest_loras(Manifest& m) {
  for (std::string& dir : m.lora_dirs) {
    const std::string where = m.lora_dirs_where.empty() ? m.path + ": lora.dirs" : m.lora_dirs_where;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw ConfigError(fmt::format("{}: {} is not a folder{}", where, clip_text(dir, 400),
                                    fs::exists(dir, ec) ? "" : " (it does not exist)"),
                        true);
    }
    std::string why;
    const std::string c = canonical_of(dir, why);
    if (c.empty()) throw ConfigError(fmt::format("{}: {}: {}", where, clip_text(dir, 400), why), true);
    dir = c;
  }
  if (!m.defaults.loras) return;
  auto& set = *m.defaults.loras;
  for (size_t i = 0; i < set.size(); ++i) {
    const std::string where = i < m.lora_where.size() ? m.lora_where[i] : fmt::format("{}: loras[{}].path", m.path, i);
    std::string why = lora::lora_file_problem(set[i].path);
    std::string c;
    if (why.empty()) c = canonical_of(set[i].path, why);
    // Named as written (the absolute path where it differs and is missing).
    const std::string named = i < m.lora_written.size() ? m.lora_written[i] : set[i].path;
    if (!why.empty()) {
      throw ConfigError(fmt::format("{}: {} {}{}", where, clip_text(named, 400), why,
                                    named != set[i].path && why == "does not exist"
                                        ? fmt::format(" ({})", clip_text(set[i].path, 400))
                                        : ""),
                        true);
    }
    for (size_t j = 0; j < i; ++j) {
      if (set[j].path == c) {
        throw ConfigError(fmt::format("{}: {} is listed twice (also loras[{}]): give it once, with the scales summed",
                                      where, clip_text(named, 400), j),
                          true);
      }
    }
    set[i].path = c;
  }
}

LoraPathRule::LoraPathRule(const Manifest& m) : base_(manifest_folder(m)) {
  auto add = [&](const std::string& root) {
    for (const auto& r : roots_) {
      if (r == root) return;
    }
    roots_.push_back(root);
  };
  add(base_);
  for (const std::string& dir : m.lora_dirs) add(dir);
  if (m.defaults.loras) {
    for (const auto& c : *m.defaults.loras) add(fs::path(c.path).parent_path().string());
  }
}

std::string LoraPathRule::resolve(const std::string& written, std::string& resolved) const {
  if (written.empty()) return "is empty";
  if (written.find('\0') != std::string::npos) return "holds a NUL character";
  const fs::path p = fs::path(written).is_absolute() ? fs::path(written) : fs::path(base_) / written;
  const std::string given = p.lexically_normal().string();
  if (std::string why = lora::lora_file_problem(given); !why.empty()) return why;
  std::string why;
  resolved = canonical_of(given, why);
  if (resolved.empty()) return fmt::format("cannot be resolved: {}", why);
  for (const auto& root : roots_) {
    if (path_within(resolved, root)) return "";
  }
  std::string roots;
  for (const auto& r : roots_) roots += (roots.empty() ? "" : ", ") + r;
  return fmt::format("resolves to {}, outside the folders a request's adapters may come from ({}): add its "
                     "folder to the manifest's [lora] dirs",
                     clip_text(resolved, 400), clip_text(roots, 800));
}

std::vector<JobRequest> read_job_requests(Manifest& m) {
  resolve_manifest_loras(m);
  const LoraPathRule rule(m);
  return read_requests(m.requests, m.defaults, [&rule](const std::string& written, std::string& resolved) {
    return rule.resolve(written, resolved);
  });
}

}  // namespace tprun::jobs
