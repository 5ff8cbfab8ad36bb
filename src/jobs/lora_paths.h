#pragma once
// Where a job's LoRA adapter files may come from, and what each must be.
// docs/jobs.md "LoRA adapters" states the rule for users:
//
//  - A path is relative to the manifest's folder (an absolute one is taken as
//    given), in the manifest's [[loras]] and in a request's "loras" alike.
//  - It names an existing regular file (symlinks followed) whose name ends in
//    ".safetensors" and that this process may read. A folder, a FIFO, a
//    device or a socket is refused before anything opens it.
//  - The manifest's [[loras]] files may lie anywhere: the manifest's author
//    named them, as they name `model`.
//  - A request's own adapters must resolve, after every symlink, inside the
//    manifest's folder, inside a folder of [lora] dirs, or inside the folder
//    of one of the [[loras]] files: a requests file (often generated, or
//    someone else's) cannot reach /etc or a home folder through "../" or a
//    symlink.
//  - Every path becomes canonical (std::filesystem::canonical), so a set's key
//    (lora::lora_set_key) names each file one way and records show where it
//    really is.
//
// Adapter files are inputs: nothing here opens them (stat only); they are
// read by the hash (jobs/lora_records.h) and the loader, never for writing.
// The checks are deterministic: every rank that runs them gets the same
// verdict and the same message.

#include <string>
#include <vector>

#include "jobs/manifest.h"
#include "jobs/request_list.h"

namespace tprun::jobs {


// The [[loras]] files and [lora] dirs of a parsed manifest checked and made
// canonical (defaults.loras, lora_dirs). ConfigError "<file>:<line>:
// loras[0].path: <path> <problem>" / "<file>:<line>: lora.dirs: <dir> is not
// a folder". Deterministic; runs on every rank.
void resolve_manifest_loras(Manifest& m);

// The rule a request's own adapter paths are held to (above).
class LoraPathRule {
 public:
  // From a manifest that resolve_manifest_loras has resolved: its folder,
  // its [lora] dirs and the folders of its [[loras]] files.
  explicit LoraPathRule(const Manifest& m);

  // `written` (relative to the manifest's folder) as a canonical path in
  // `resolved`; returns "" then, else why it is refused (resolved is left
  // unspecified).
  std::string resolve(const std::string& written, std::string& resolved) const;

  // The folders a request's adapters may lie in (canonical), for messages and tests.
  const std::vector<std::string>& roots() const { return roots_; }

 private:
  std::string base_;                // the manifest's folder, canonical
  std::vector<std::string> roots_;  // base_ first, then the [lora] dirs, then the [[loras]] files' folders
};

// The requests of a parsed manifest as `tprun run` reads them: the
// manifest's adapters resolved first (resolve_manifest_loras, on `m`), then
// read_requests with each request's adapter paths held to the rule. For
// every reader of a job's requests that needs the adapter files (`tprun run`,
// `tprun plan` counting their bytes).
std::vector<JobRequest> read_job_requests(Manifest& m);

}  // namespace tprun::jobs
