// The manifest's checks against the folders it names (check_paths, check_defaults): a file of its
// own because they read the model folder's configs (checkpoint/pipelines), which the parsers and
// their fuzz target (tests/fuzz) do not link.
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "checkpoint/pipeline_folder.h"
#include "jobs/manifest.h"
#include "jobs/output_folder.h"
#include "jobs/video_output.h"
#include "pipelines/request_checks.h"
#include "runtime/error.h"

namespace tprun::jobs {

namespace fs = std::filesystem;

void check_defaults(const Manifest& m, const pipelines::RequestOptions& options) {
  pipelines::check_request_options(m.defaults, options, [&](const std::string& key, const std::string& what) {
    auto it = m.defaults_where.find(key);
    const std::string where = it != m.defaults_where.end() ? it->second : fmt::format("{}: defaults.{}", m.path, key);
    throw ConfigError(fmt::format("{}: {} (model {})", where, what, m.model), true);
  });
}

void check_defaults(const Manifest& m) {
  const pipelines::RequestOptions options = pipelines::request_options(m.model);
  check_defaults(m, options);
  check_formats(m, options);
}

void check_formats(const Manifest& m, const pipelines::RequestOptions& options) {
  if ((m.mp4 || m.frame_pngs) && !options.makes_videos()) {
    throw ConfigError(fmt::format("{}: output.formats: {} is for videos, and {} makes images (model {}): use png, "
                                  "hdf5 or latents",
                                  m.path, m.mp4 ? "mp4" : "frames", options.cls, m.model),
                      true);
  }
  if (m.mp4) {
    if (const std::string why = mp4_writer_problem(); !why.empty()) {
      throw ConfigError(fmt::format("{}: output.formats: mp4: {}", m.path, why), true);
    }
  }
}

void check_paths(const Manifest& m) {
  if (!checkpoint::is_pipeline_folder(m.model)) {  // a stat error other than "missing" is said as it is
    throw ConfigError(fmt::format("{}: model: {} is not a pipeline folder (no model_index.json)", m.path, m.model),
                      true);
  }
  std::error_code ec;
  const auto requests = fs::status(m.requests, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    throw ConfigError(fmt::format("{}: requests: {}: {}", m.path, m.requests, ec.message()), true);
  }
  if (!fs::exists(requests)) {
    throw ConfigError(fmt::format("{}: requests: {}: no such file", m.path, m.requests), true);
  }
  if (!fs::is_regular_file(requests)) {
    throw ConfigError(fmt::format("{}: requests: {} is not a regular file", m.path, m.requests), true);
  }

  // The offload folders are written to: never inside the model folder, never an input.
  check_offload_folders(m.memory, m.path, job_inputs(m));
}

}  // namespace tprun::jobs
