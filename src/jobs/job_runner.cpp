// The batch job as named steps up to the schedule: validate, mesh, phases,
// load, resume, check, schedule (job_run_loop.cpp: the replica loop and the
// results). See job_runner.h and job_run.h.
#include "jobs/job_runner.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "dist/communicator.h"
#include "dist/control_plane.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "dist/session.h"
#include "jobs/hdf5_store.h"
#include "jobs/job_fit.h"
#include "pipelines/fit_planner.h"
#include "pipelines/pipeline_layout.h"
#include "jobs/job_run.h"
#include "jobs/job_schedule.h"
#include "jobs/lora_paths.h"
#include "jobs/lora_records.h"
#include "jobs/merge_results.h"
#include "jobs/output_folder.h"
#include "jobs/progress.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "jobs/run_status.h"
#include "jobs/staged_phases.h"
#include "jobs/video_output.h"
#include "pipelines/pipeline.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "runtime/rank_env.h"
#include "runtime/memory_release.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop{0};

extern "C" void on_stop_signal(int) { g_stop.store(1); }

JobPlan read_plan(const RunOptions& o) {
  JobPlan p;
  p.manifest = parse_manifest(o.manifest, o.overrides);
  check_requests_file(p.manifest.path, p.manifest.requests);
  check_paths(p.manifest);
  check_defaults(p.manifest);  // against the pipeline's own limits, before any weight
  // [[loras]] and [lora] dirs checked and made canonical, then the requests with their adapter paths held
  // to the rule (jobs/lora_paths.h).
  p.requests = read_job_requests(p.manifest);
  if (o.shard_count > 0) {
    check_shard_count({o.shard_index, o.shard_count}, p.requests.size(), p.manifest.requests);
    std::vector<JobRequest> mine;
    for (size_t i = 0; i < p.requests.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(o.shard_count)) == o.shard_index) mine.push_back(p.requests[i]);
    }
    p.requests = std::move(mine);
    p.manifest.output_dir =
        (fs::path(p.manifest.output_dir) / fmt::format("shard-{}-of-{}", o.shard_index, o.shard_count)).string();
    if (p.requests.empty()) {
      throw ConfigError(fmt::format("--shard {}/{}: {} has no request in this chunk", o.shard_index, o.shard_count,
                                    p.manifest.requests),
                        true);
    }
  }
  return p;
}

// What tprun makes in an output folder is never a symlink (its files would
// land outside): the chunk folder of --shard, images/, store/, embeddings/
// and results.jsonl (the lock file: OutputLock). Checked before any weight
// loads, and again where each is made or written.
void check_output_names(const fs::path& out, bool shard) {
  std::error_code ec;
  if (shard && fs::is_directory(out.parent_path(), ec)) {
    check_output_entry(out.parent_path(), out.filename().string(), EntryKind::Folder);
  }
  if (!fs::is_directory(out, ec)) return;
  for (const char* folder : {"images", "videos", "store", "embeddings"}) {
    check_output_entry(out, folder, EntryKind::Folder);
  }
  check_output_entry(out, "results.jsonl", EntryKind::File);
}

// Every request that will run again and whose images/<id>.png is there: the
// file must be one tprun wrote (it is replaced), else the run is refused now,
// before any weight loads, naming the file. Kept outputs (`done` and whole,
// or `failed` and not retried) are never written, so never checked.
void check_request_images(const JobPlan& plan, const ResultsLog& log, bool retry_failed, const fs::path& out,
                          const LoraHashes& lora_hashes) {
  const Manifest& m = plan.manifest;
  std::error_code ec;
  auto check = [&](const JobRequest& r, const std::string& rel, OutputKind kind, bool kept) {
    const fs::path path = out / rel;
    if (!fs::exists(fs::symlink_status(path, ec))) return;
    if (auto it = log.records().find(r.id); it != log.records().end()) {
      if (it->second.status == "failed" && !retry_failed) return;
      // Made with other adapters: it runs again (resume), so its files are replaced.
      if (it->second.status == "done" && kept && !lora_change(it->second.loras, lora_records(r, m, lora_hashes)).content) {
        return;
      }
    }
    const std::string why = foreign_output(path.string(), kind);
    if (!why.empty()) {
      throw ConfigError(fmt::format("{}: request '{}' would write {}, which {}; tprun never replaces a file it did not "
                                    "write: move it away, or choose another output folder (--out DIR)",
                                    m.path, clip_text(r.id), clip_text(path.string(), 400), why),
                        true);
    }
  };
  const bool images = m.png && fs::is_directory(out / "images", ec);
  const bool videos = (m.mp4 || m.frame_pngs) && fs::is_directory(out / "videos", ec);
  if (!images && !videos) return;
  for (const JobRequest& r : plan.requests) {
    if (images) {
      const std::string rel = "images/" + r.id + ".png";
      check(r, rel, OutputKind::Png, output_file_problem(out.string(), rel).empty());
    }
    if (videos && m.mp4) {
      const std::string rel = mp4_output_rel(r.id);
      check(r, rel, OutputKind::Mp4, output_file_problem(out.string(), rel).empty());
    }
    if (videos && m.frame_pngs) {
      // Every frame_*.png already in the request's frames folder (its frame count is the pipeline's).
      const fs::path dir = out / frames_output_rel(r.id);
      if (!fs::is_directory(fs::symlink_status(dir, ec))) continue;
      auto it = log.records().find(r.id);
      const int64_t frames = it != log.records().end() ? it->second.frames : 1;
      const bool kept = frame_pngs_problem(dir, frames).empty();
      std::error_code lec;
      for (fs::directory_iterator e(dir, lec), end; !lec && e != end; e.increment(lec)) {
        const std::string name = e->path().filename().string();
        if (name.rfind("frame_", 0) == 0 && e->path().extension() == ".png") {
          check(r, frames_output_rel(r.id) + "/" + name, OutputKind::Png, kept);
        }
      }
    }
  }
}

// The output folder made (the user's path as given, symlinks in it followed;
// below it, the chunk folder and images/ by mkdir, never through a symlink).
void create_output_folder(const fs::path& out, bool shard, const std::string& manifest) {
  const fs::path base = shard ? out.parent_path() : out;
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) throw_io_error(manifest + ": output.dir: cannot create", base.string(), ec.value());
  if (shard) make_output_folder(base, out.filename().string());
  make_output_folder(out, "images");
}

// Whether the done request `r`'s video outputs are whole (mp4: every box in
// place, frames: every frame a whole PNG); `why` says what is not.
bool videos_whole(const Manifest& m, const fs::path& out, const ResultRecord& rec, std::string& why) {
  if (m.mp4) {
    why = output_file_problem(out.string(), mp4_output_rel(rec.id));
    if (!why.empty()) {
      why = fmt::format("{} {}", (out / mp4_output_rel(rec.id)).string(), why);
      return false;
    }
  }
  if (m.frame_pngs) {
    why = frame_pngs_problem(out / frames_output_rel(rec.id), rec.frames);
    if (!why.empty()) return false;
  }
  return true;
}

}  // namespace


// 1. Manifest and requests, parsed and checked on rank 0: one verdict for all,
//    before any model is loaded or anything written.
void JobRun::validate() {
  if (rank_ == 0) {
    if (const char* restarts = std::getenv("SLURM_RESTART_COUNT")) {
      spdlog::info("Slurm job {} restart count {} (requeued: finished requests are kept)",
                   std::getenv("SLURM_JOB_ID") ? std::getenv("SLURM_JOB_ID") : "?", restarts);
    }
    if (options_.shard_count > 0) {
      spdlog::info("chunk {} of {} of the requests", options_.shard_index, options_.shard_count);
    }
  }
  control_.agree([&] { plan_ = read_plan(options_); });
  if (rank_ != 0) plan_ = read_plan(options_);
  const Manifest& m = plan_.manifest;
  hash_loras();
  const int world = session_.world();
  control_.agree([&] {
    const int dp = m.tp == 0 ? 0 : m.dp > 0 ? m.dp : (world % m.tp == 0 ? world / m.tp : 0);
    if (m.tp != 0 && (dp == 0 || m.tp * dp != world)) {
      throw ConfigError(fmt::format("{}: parallel.tp {} x parallel.dp {} must equal the number of ranks {}", m.path,
                                    m.tp, m.dp > 0 ? std::to_string(m.dp) : std::string("(world / tp)"), world),
                        true);
    }
    const bool on_cuda = session_.device().device.rfind("cuda", 0) == 0;
    if ((m.device == "cpu" && on_cuda) || (m.device == "cuda" && !on_cuda)) {
      throw ConfigError(fmt::format("{}: parallel.device is '{}' but this rank runs on {} ({}); {}", m.path, m.device,
                                    session_.device().device, session_.device().reason,
                                    device_mismatch_advice(m.device, session_.device())),
                        true);
    }
  });
  out_dir_ = m.output_dir;
  images_ = out_dir_ / "images";
  // Where the outputs go: refused inside the model folder; a folder that
  // already exists is locked now (a second run is refused before it loads a
  // weight) and its log read. Nothing is created yet (see resume()).
  control_.agree([&] {
    const std::string warning = check_output_placement(m);
    if (!warning.empty()) spdlog::warn("{}", warning);
    check_output_names(out_dir_, options_.shard_count > 0);
    std::error_code ec;
    if (fs::is_directory(out_dir_, ec)) {
      lock_ = OutputLock::acquire(out_dir_.string());
      log_ = std::make_unique<ResultsLog>(out_dir_.string());
      check_request_images(plan_, *log_, options_.retry_failed, out_dir_, lora_hashes_);
    }
  });
}

// 2. The mesh: dp replicas x tp groups.
void JobRun::make_mesh() {
  const Manifest& m = plan_.manifest;
  dist::MeshSpec spec;
  spec.tp = m.tp;
  spec.dp = m.dp;
  spec.allow_cross_node_tp = m.allow_cross_node_tp;
  mesh_ = session_.make_mesh(spec);
}

// 4. Resume (rank 0), once the model loaded (a run that fails before its first
//    request leaves nothing behind): the output folder created and locked;
//    stale temporaries removed (only under the lock); what is done, what runs;
//    the log rewritten without the ids that run again. The list is broadcast.
void JobRun::resume() {
  const Manifest& m = plan_.manifest;
  std::string todo_json;
  control_.agree([&] {
    std::error_code ec;
    create_output_folder(out_dir_, options_.shard_count > 0, m.path);
    if (!lock_) lock_ = OutputLock::acquire(out_dir_.string());
    check_output_names(out_dir_, options_.shard_count > 0);
    if (!lock_->unsupported().empty()) {
      spdlog::warn("{}: the file system refuses locks ({}): nothing stops a second run on this output folder; run one "
                   "at a time",
                   lock_->path(), lock_->unsupported());
    }
    std::vector<fs::path> scratch = {out_dir_, images_, out_dir_ / "store", out_dir_ / "videos"};
    for (const auto& r : plan_.requests) {  // a frames folder a run was writing into
      if (m.frame_pngs) scratch.push_back(out_dir_ / frames_output_rel(r.id));
    }
    for (const fs::path& d : scratch) {
      if (fs::is_symlink(fs::symlink_status(d, ec))) continue;  // never listed through a link (written: refused)
      if (!fs::is_directory(d, ec)) continue;
      for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code fec;
        if (fs::is_regular_file(it->symlink_status(fec)) && is_output_temp(it->path().filename().string())) {
          spdlog::info("removing a temporary file left by an interrupted run: {}", it->path().string());
          if (!fs::remove(it->path(), fec) && fec) throw_io_error("cannot remove", it->path().string(), fec.value());
        }
      }
      if (ec) throw_io_error("cannot list", d.string(), ec.value());
    }
    if (!log_) log_ = std::make_unique<ResultsLog>(out_dir_.string());
    if (log_->torn_lines() > 0) {
      spdlog::warn("{}: dropped its last line, cut short by an interrupted writer: '{}'", log_->path(),
                   clip_text(log_->torn_text(), 200));
    }
    const bool use_store = m.hdf5 || m.latents;
    const std::set<std::string> stored =
        use_store ? Hdf5Store::stored_ids(out_dir_.string(), m.hdf5, m.latents) : std::set<std::string>{};
    nlohmann::json todo = nlohmann::json::array();
    std::set<std::string> rerun;
    for (const auto& r : plan_.requests) {
      auto it = log_->records().find(r.id);
      if (it != log_->records().end()) {
        const auto& rec = it->second;
        bool image_ok = !use_store || stored.count(r.id) != 0;
        if (rec.status == "done" && !image_ok) {
          spdlog::warn("request {}: recorded done, but the HDF5 store holds no complete data for it; it runs again",
                       r.id);
        }
        if (rec.status == "done" && image_ok && m.png) {
          // Whole (every CRC), a regular file, no symlink leading out of the folder.
          const std::string why = output_file_problem(out_dir_.string(), "images/" + r.id + ".png");
          if (!why.empty()) {
            spdlog::warn("request {}: recorded done, but {} is incomplete ({}); it runs again", r.id,
                         (images_ / (r.id + ".png")).string(), why);
            image_ok = false;
          }
        }
        if (rec.status == "done" && image_ok && (m.mp4 || m.frame_pngs)) {
          std::string why;
          if (!videos_whole(m, out_dir_, rec, why)) {
            spdlog::warn("request {}: recorded done, but {}; it runs again", r.id, why);
            image_ok = false;
          }
        }
        if (rec.status == "done" && image_ok) {
          // Made with other adapters (another file content, scale, count or
          // order): not this request's result; it runs again, replacing
          // tprun's own outputs (never a file tprun did not write). The same
          // bytes under other names: kept, and said.
          const LoraChange change = lora_change(rec.loras, lora_records(r, m, lora_hashes_));
          if (change.content) {
            spdlog::warn("request {}: recorded done, but {}; it runs again", r.id, change.what);
            image_ok = false;
          } else if (change.names) {
            spdlog::warn("request {}: recorded done with the same adapter files by content and scale under other "
                         "paths ({}); kept as done",
                         r.id, change.what);
          }
        }
        if ((rec.status == "done" && image_ok) || (rec.status == "failed" && !options_.retry_failed)) {
          ++skipped_;
          continue;
        }
        rerun.insert(r.id);
      }
      todo.push_back(r.id);
    }
    log_->begin(rerun);
    todo_json = todo.dump();
  });
  control_.broadcast(todo_json);
  control_.broadcast(skipped_);
  std::map<std::string, const JobRequest*> by_id;
  for (const auto& r : plan_.requests) by_id[r.id] = &r;
  for (const auto& id : nlohmann::json::parse(todo_json)) todo_.push_back(by_id.at(id.get<std::string>()));
  if (rank_ == 0) {
    spdlog::info("job {}: {} requests, {} already finished, {} to run on {} replica(s) x tp {}", m.path,
                 plan_.requests.size(), skipped_, todo_.size(), mesh_->dp_size(), m.tp);
  }
}

// How the phases run: every component resident ("together"), or the text
// encoders first, then the transformer and VAE ("staged"); with tp = "auto"
// or phases = "auto" the fit planner decides on world rank 0 (configs and
// headers only; the same table `tprun plan` prints) and every rank follows.
void JobRun::choose_phases() {
  Manifest& m = plan_.manifest;
  if (m.tp > 0 && m.phases != "auto") {
    staged_ = m.phases == "staged";
  } else {
    int64_t tp = m.tp, staged = 0;
    control_.agree([&] {
      const auto env = rank_env_from_variables(process_env());
      const std::string device = session_.device().device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
      pipelines::FitQuery q = fit_query(m, plan_.requests, session_.world(), device);
      q.ranks_per_node = env && env->local_size > 0 ? env->local_size : session_.world();
      pipelines::FitPlan plan;
      try {
        plan = pipelines::plan_fit(q);
      } catch (const Error& e) {
        if (m.tp == 0) throw;
        // phases = "auto" with a fixed tp: the load checks the folder itself
        // and names what is wrong; without a plan everything stays resident.
        spdlog::warn("{}: the fit planner could not plan this job ({}); schedule.phases = \"auto\" runs it together",
                     m.path, e.what());
        return;
      }
      spdlog::info("the fit planner's table:\n{}", format_fit_plan(plan, m.model, q.world));
      if (tp == 0) {
        if (!plan.chosen) {
          throw ConfigError(fmt::format("{}: parallel.tp = \"auto\": {}", m.path, no_fit_message(plan, m.model, q.world)),
                            true);
        }
        tp = plan.chosen->tp;
      }
      staged = (m.phases == "auto" ? plan.auto_stages_at(static_cast<int>(tp)) : m.phases) == "staged";
      const pipelines::FitCandidate* candidate = plan.find(static_cast<int>(tp), "staged");
      if (m.phases == "auto" && staged && candidate && !candidate->fits) {
        spdlog::warn("{}: the planner predicts a peak of {} per rank at tp {} even staged, over the {} it plans "
                     "for; running staged anyway",
                     m.path, format_bytes(candidate->peak), tp, format_bytes(plan.rank_memory));
      }
    });
    control_.broadcast(tp);
    control_.broadcast(staged);
    m.tp = static_cast<int>(tp);
    staged_ = staged != 0;
  }
  if (rank_ == 0) {
    spdlog::info("schedule.phases = \"{}\"{}: {}; tp {} x dp {}", m.phases,
                 m.phases == "auto" ? (staged_ ? " (staged)" : " (together)") : "",
                 staged_ ? "encode the prompts, free the text encoders, then denoise" : "every component resident",
                 m.tp, m.dp > 0 ? m.dp : session_.world() / m.tp);
  }
}

// schedule.experts: "staged" / "resident" as set; "auto" asks the fit
// planner whether both experts fit beside everything else at the job's tp
// and phases (a pipeline without experts: nothing to choose).
void JobRun::choose_experts() {
  Manifest& m = plan_.manifest;
  if (m.experts != "auto") {
    stage_experts_ = m.experts == "staged";
    return;
  }
  int64_t staged = 0;
  control_.agree([&] {
    const auto env = rank_env_from_variables(process_env());
    const std::string device = session_.device().device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    pipelines::FitQuery q = fit_query(m, plan_.requests, session_.world(), device);
    q.ranks_per_node = env && env->local_size > 0 ? env->local_size : session_.world();
    q.stages = staged_ ? "staged" : "together";
    q.options.stage_experts = false;
    pipelines::FitPlan plan;
    try {
      if (!pipelines::pipeline_layout(m.model, q.options).find("transformer_2")) return;
      plan = pipelines::plan_fit(q);
    } catch (const Error& e) {
      // The load checks the folder itself and names what is wrong.
      spdlog::warn("{}: the fit planner could not plan the experts ({}); schedule.experts = \"auto\" keeps both "
                   "resident",
                   m.path, e.what());
      return;
    }
    const pipelines::FitCandidate* resident = plan.find(m.tp, q.stages);
    if (resident && resident->fits) return;
    staged = 1;
  });
  control_.broadcast(staged);
  stage_experts_ = staged != 0;
  if (rank_ == 0) {
    spdlog::info("schedule.experts = \"{}\"{}: {}", m.experts, stage_experts_ ? " (staged)" : " (resident)",
                 stage_experts_ ? "one expert held at a time, swapped once per round"
                                : "every expert resident (or the pipeline has one)");
  }
}

// 3. The pipeline model_index.json names (staged: its text encoders only);
//    every request gets its defaults.
void JobRun::load() {
  spdlog::info("{}", memory::describe(plan_.manifest.memory));
  load_pipeline(staged_);
  for (auto& r : plan_.requests) r.gen = pipe_->with_defaults(r.gen);
}

// The pipeline in full, or (staged) its text encoders only or its transformer
// and VAE only; the one held before is freed first and its memory returned.
void JobRun::load_pipeline(bool encoders_only) {
  const Manifest& m = plan_.manifest;
  if (pipe_) {
    pipe_.reset();
    const uint64_t freed = release_free_memory();
    spdlog::info("freed the {} ({} returned to the system)", encoders_loaded_ ? "text encoders" : "denoiser",
                  format_bytes(freed));
  }
  parallel::TpContext tp{mesh_->tp_rank(), mesh_->tp_size(), mesh_->tp_size() > 1 ? &mesh_->tp_device() : nullptr};
  pipelines::PipelineOptions lo;
  lo.dtype = m.dtype;
  lo.device = session_.device().device;
  lo.shard_text_encoders = m.shard_text_encoders;
  lo.shard_modulation = m.shard_modulation;
  lo.stage_experts = stage_experts_;
  lo.component_base.memory = m.memory;
  lo.text_encoders = !staged_ || encoders_only;
  lo.denoiser = !staged_ || !encoders_only;
  const auto t0 = Clock::now();
  pipe_ = pipelines::load_pipeline(m.model, tp, lo);
  encoders_loaded_ = staged_ && encoders_only;
  spdlog::info("loaded {} ({}{}) in {:.2f} s ({} bytes on this rank)", m.model, pipe_->class_name(),
               !staged_ ? "" : encoders_only ? ": text encoders" : ": transformer and VAE", seconds_since(t0),
               pipe_->bytes_loaded());
  // A pipeline loaded after the schedule (staged: the transformer and VAE of
  // each round, the encoders of the next) is told the replica's sets too.
  if (loras_prepared_) prepare_loras(false);
}

// Every request to run is checked once (batching, the store and the loop use
// the verdict).
void JobRun::check_requests() {
  for (const JobRequest* r : todo_) {
    try {
      pipe_->check_request(r->gen);
      if (std::string why = output_frames_problem(*r); !why.empty()) {  // recorded `failed` by its replica
        output_refused_.emplace(r->id, std::move(why));
        continue;
      }
      runnable_.insert(r);
    } catch (const RequestError&) {
      // fails without output; recorded `failed` by its replica
    }
  }
}

// 5. Units of work and this replica's share (the same on every rank, no
//    messages); the HDF5 store of this run, created collectively.
void JobRun::schedule() {
  const Manifest& m = plan_.manifest;
  auto units = make_units(todo_, m.batch_size, [&](const JobRequest& r) -> std::optional<std::string> {
    if (!runnable_.count(&r)) return std::nullopt;
    // The pipeline's key holds the adapter set: a batch never mixes sets.
    return pipe_->batch_key(r.gen);
  });
  mine_ = assign_units(std::move(units), mesh_->dp_size(),
                       [&](const JobRequest& r) { return pipe_->cost(r.gen); })[static_cast<size_t>(mesh_->dp_rank())];
  // Each set's units together (the assignment, so the cost, unchanged), then
  // the sets told to the pipeline before any compute.
  group_by_lora_set(mine_);
  if (job_has_loras()) {
    std::vector<const JobRequest*> runs;
    for (const Unit& u : mine_) {
      for (const JobRequest* r : u) {
        if (runnable_.count(r)) runs.push_back(r);
      }
    }
    lora_sets_ = distinct_lora_sets(runs);
    prepare_loras(true);
    loras_prepared_ = true;
  }
  if (m.hdf5 || m.latents) {
    std::vector<StoreRequest> srs;
    for (const JobRequest* r : todo_) {
      if (!runnable_.count(r)) continue;
      srs.push_back({r, pipe_->request_latent_shape(r->gen), lora_records_json(lora_records(*r, m, lora_hashes_))});
    }
    store_ = std::make_unique<Hdf5Store>(out_dir_.string(), m.hdf5, m.latents, srs, control_, MPI_COMM_WORLD);
  }
  if (staged_) {
    // Swept by world rank 0 (bad chunks moved aside) and indexed by every
    // rank before any replica writes a chunk, so the ranks of a TP group see
    // the same cache; each group then adds only the chunks it writes itself.
    std::vector<const JobRequest*> runnable;
    for (const JobRequest* r : todo_) {
      if (runnable_.count(r)) runnable.push_back(r);
    }
    embeddings_ = open_embedding_cache(out_dir_.string(), m, mesh_->tp_size(), session_.device().device, *pipe_,
                                       runnable, control_);
  }
}

void parse_shard(const std::string& text, RunOptions& o) {
  const ShardSpec shard = parse_shard_spec(text);
  o.shard_index = shard.index;
  o.shard_count = shard.count;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A file size limit (ulimit -f) then fails the write with EFBIG, reported
  // as an I/O error, instead of killing the process mid-record.
  std::signal(SIGXFSZ, SIG_IGN);
}

bool stop_requested() { return g_stop.load() != 0; }

// --status-file: rank 0 writes the exit code every rank returns (and 75 as
// soon as a stop is requested, see run_status.h).
int run_job(Session& session, const RunOptions& options) {
  StatusFile status(options.status_file, options.manifest, session.rank() == 0);
  int code = 0;
  try {
    code = JobRun(session, options, status).run();
  } catch (const Error& e) {
    status.finish(e.exit_code());
    throw;
  }
  status.finish(code);
  return code;
}

}  // namespace tprun::jobs
