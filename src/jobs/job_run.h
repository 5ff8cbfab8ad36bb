#pragma once
// The steps of one `tprun run` as a class (internal to the jobs layer): its
// state and the order of its collective steps. job_runner.cpp holds the
// steps up to the schedule, job_run_loop.cpp the replica loop (staged
// rounds included) and the results. See job_runner.h for the job itself.

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dist/control_plane.h"
#include "dist/device_mesh.h"
#include "dist/session.h"
#include "jobs/embedding_cache.h"
#include "jobs/hdf5_store.h"
#include "jobs/job_runner.h"
#include "jobs/job_schedule.h"
#include "jobs/lora_records.h"
#include "jobs/output_folder.h"
#include "jobs/progress.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "jobs/run_status.h"
#include "pipelines/pipeline.h"

namespace tprun::jobs {

using Clock = std::chrono::steady_clock;
using Tag = dist::ControlPlane::Tag;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Thrown from the step callback once the TP group agreed to stop: leaves the
// request mid-denoise (nothing of it is written or recorded; it runs again on
// resume). Not a tprun::Error, so nothing on the way turns it into a failure.
struct StopAgreed {};

// The manifest and the requests of this run (this chunk with --shard).
struct JobPlan {
  Manifest manifest;
  std::vector<JobRequest> requests;
};

// One run of `tprun run`, step by step. Every rank constructs one and calls
// run(); the steps are collective in the order run() calls them.
class JobRun {
 public:
  JobRun(Session& session, const RunOptions& options, StatusFile& status)
      : session_(session), options_(options), status_(status), control_(session.watchdog()), rank_(session.rank()) {}

  int run() {
    validate();
    status_.arm(stop_requested);  // the inputs (the status file's path among them) checked
    choose_phases();  // may set tp ("auto"), so before the mesh
    choose_experts();
    make_mesh();
    load();
    resume();
    check_requests();
    schedule();
    replica_loop();
    return results();
  }

 private:
  void validate();
  void hash_loras();
  bool job_has_loras() const;
  void prepare_loras(bool agree);
  void note_lora_set(const Unit& unit);
  void make_mesh();
  void choose_phases();
  void choose_experts();
  void resume();
  void load();
  void load_pipeline(bool encoders_only);
  bool encode_phase(const std::vector<Unit>& round);
  void check_requests();
  void schedule();
  void replica_loop();
  int results();

  struct UnitWork;
  UnitWork begin_unit(const Unit& unit);
  void unit_part(UnitWork& w, const std::function<void()>& part);
  void unit_stage(UnitWork& w, int64_t stage);
  void end_unit(UnitWork& w);
  pipelines::StepCallback stop_check(const Unit& unit);
  void run_unit(const Unit& unit);
  void run_round_by_stage(const std::vector<Unit>& round);
  // Requests a round holds in flight when experts are staged and schedule.stage_requests is 0.
  static constexpr int64_t kExpertRoundRequests = 32;
  void drain();
  bool agree_stop();
  void write_outputs(const JobRequest& req, const pipelines::GenerationResult& res, ResultRecord& rec);
  void write_record(const ResultRecord& r);
  void handle_message(Tag tag, const std::string& payload);
  std::vector<std::pair<std::string, std::string>> png_text(const JobRequest& r) const;
  // Why the run's output formats cannot hold the request's result ("" when
  // they can): a frame sequence (frames > 1) and [output] formats with png.
  std::string output_frames_problem(const JobRequest& r) const;

  Session& session_;
  const RunOptions& options_;
  StatusFile& status_;
  dist::ControlPlane control_;
  const int rank_;

  JobPlan plan_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::unique_ptr<OutputLock> lock_;  // world rank 0 only: the output folder's, for the whole run
  std::unique_ptr<ResultsLog> log_;   // world rank 0 only
  std::filesystem::path out_dir_, images_;
  std::vector<const JobRequest*> todo_;
  int64_t skipped_ = 0;
  std::unique_ptr<pipelines::Pipeline> pipe_;
  std::set<const JobRequest*> runnable_;
  // Requests the pipeline accepts whose result the output formats cannot
  // hold (output_frames_problem): id -> why; recorded failed, never run.
  std::map<std::string, std::string> output_refused_;
  std::vector<Unit> mine_;
  std::unique_ptr<Hdf5Store> store_;

  // LoRA adapters: each distinct file's hash (every rank: records, store
  // attributes, resume); the replica's distinct sets in the order its units
  // run (told to the pipeline before any compute, and after each later
  // load); the set in force (its key) and the switches so far.
  LoraHashes lora_hashes_;
  std::vector<std::vector<lora::LoraChoice>> lora_sets_;
  bool loras_prepared_ = false;
  std::string lora_in_force_;
  int64_t lora_switches_ = 0;

  // Staged phases: pipe_ holds the text encoders only (encoders_loaded_) or
  // the transformer and VAE only; the embeddings live in the output folder.
  bool staged_ = false, encoders_loaded_ = false;
  bool stage_experts_ = false;  // schedule.experts (or the planner's choice): one expert held at a time
  std::unique_ptr<EmbeddingCache> embeddings_;
  std::map<std::string, std::string> encode_failed_;  // request id -> why its text could not be encoded
  int64_t texts_encoded_ = 0, texts_reused_ = 0;
  double round_encode_s_ = 0;  // the current round's encode seconds per request

  // The loop's tallies (world rank 0 sums the records of every replica).
  std::unique_ptr<Progress> progress_;
  double stage_sums_[3] = {0, 0, 0};  // encode, denoise, decode over this run's records
  int64_t failed_ = 0, recorded_ = 0;  // recorded_: records of this run (an interrupted one has fewer)
  int finishes_ = 0, interrupted_replicas_ = 0;
  bool interrupted_ = false;
  double compute_s_ = 0, loop_s_ = 0;
  Clock::time_point loop_start_;
};

}  // namespace tprun::jobs
