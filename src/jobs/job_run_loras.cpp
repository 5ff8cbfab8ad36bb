// The LoRA steps of `tprun run` (JobRun members): the adapters' hashes for
// the records and resume, and the sets each replica's pipeline is told
// before any compute. See job_run.h, jobs/lora_records.h.
#include <cstring>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "dist/communicator.h"
#include "jobs/job_run.h"
#include "jobs/lora_records.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"

namespace tprun::jobs {

// The adapters' content hashes for the records and resume: world rank 0
// reads each distinct file once (sequentially, in chunks), every rank gets
// them; an unreadable file ends the job on every rank, before any load.
void JobRun::hash_loras() {
  std::string json;
  control_.agree([&] {
    uint64_t bytes = 0;
    const auto t0 = Clock::now();
    const LoraHashes hashes = hash_lora_files(plan_.requests, &bytes);
    if (!hashes.empty()) {
      spdlog::info("LoRA adapters: {} file(s), {} hashed (XXH3-128) in {:.2f} s", hashes.size(), format_bytes(bytes),
                   seconds_since(t0));
    }
    json = lora_hashes_json(hashes);
  });
  control_.broadcast(json);
  lora_hashes_ = parse_lora_hashes(json);
}

bool JobRun::job_has_loras() const {
  for (const JobRequest& r : plan_.requests) {
    if (!r.gen.lora_set().empty()) return true;
  }
  return false;
}

// The replica's adapter sets (lora_sets_, in the order its units run) to the
// pipeline held now, with the manifest's [lora] options. `agree`: the first
// time, where every rank calls it at the same point: an Error on any rank
// (a malformed adapter, keys of another family, ...) ends the job on every
// rank with that rank's message, before any compute.
void JobRun::prepare_loras(bool agree) {
  const Manifest& m = plan_.manifest;
  std::string error;
  int64_t kind = 0;
  try {
    pipe_->prepare_loras(lora_sets_, m.lora_strict, m.lora_apply);
  } catch (const Error& e) {
    if (!agree) throw;
    error = e.what();
    kind = static_cast<int64_t>(e.kind());
  }
  if (!agree) return;
  // The first rank that failed (world order) and its message, on every rank.
  // (world - rank where it failed, else 0: the largest is the first rank that failed.)
  const int64_t world = session_.world();
  at::Tensor who = at::full({1}, error.empty() ? int64_t{0} : world - rank_, at::TensorOptions().dtype(at::kLong));
  mesh_->world().all_reduce(who, {dist::ReduceOp::Max});
  if (who.item<int64_t>() == 0) return;
  const int64_t root = world - who.item<int64_t>();
  at::Tensor head = at::tensor({kind, static_cast<int64_t>(error.size())}, at::TensorOptions().dtype(at::kLong));
  mesh_->world().broadcast(head, {static_cast<int>(root)});
  at::Tensor text = at::zeros({head[1].item<int64_t>()}, at::TensorOptions().dtype(at::kByte));
  if (rank_ == root) std::memcpy(text.data_ptr(), error.data(), error.size());
  mesh_->world().broadcast(text, {static_cast<int>(root)});
  const std::string message(reinterpret_cast<const char*>(text.data_ptr()), static_cast<size_t>(text.numel()));
  throw Error(static_cast<Error::Kind>(head[0].item<int64_t>()),
              fmt::format("{} (raised on rank {})", message, root), true);
}

}  // namespace tprun::jobs
