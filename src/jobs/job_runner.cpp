// The batch job as named steps: validate, mesh, resume, load, schedule, the
// replica loop, results. See job_runner.h.
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
#include "jobs/job_schedule.h"
#include "jobs/merge_results.h"
#include "jobs/output_folder.h"
#include "jobs/progress.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "jobs/run_status.h"
#include "pipelines/pipeline.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Tag = dist::ControlPlane::Tag;

namespace {

std::atomic<int> g_stop{0};

extern "C" void on_stop_signal(int) { g_stop.store(1); }

// Thrown from the step callback once the TP group agreed to stop: leaves the
// request mid-denoise (nothing of it is written or recorded; it runs again on
// resume). Not a tprun::Error, so nothing on the way turns it into a failure.
struct StopAgreed {};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Plan {
  Manifest manifest;
  std::vector<JobRequest> requests;
};

Plan read_plan(const RunOptions& o) {
  Plan p;
  p.manifest = parse_manifest(o.manifest, o.overrides);
  check_requests_file(p.manifest.path, p.manifest.requests);
  check_paths(p.manifest);
  p.requests = read_requests(p.manifest.requests, p.manifest.defaults);
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

bool is_stale_temp(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.size() > 1 && n[0] == '.' && n.find(".tmp") != std::string::npos;
}

// One run of `tprun run`, step by step. Every rank constructs one and calls
// run(); the steps are collective in the order run() calls them.
class JobRun {
 public:
  JobRun(Session& session, const RunOptions& options, StatusFile& status)
      : session_(session), options_(options), status_(status), control_(session.watchdog()), rank_(session.rank()) {}

  int run() {
    validate();
    status_.arm(stop_requested);  // the inputs (the status file's path among them) checked
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
  void make_mesh();
  void resume();
  void load();
  void check_requests();
  void schedule();
  void replica_loop();
  int results();

  void run_unit(const Unit& unit);
  bool agree_stop();
  void write_outputs(const JobRequest& req, const pipelines::GenerationResult& res, ResultRecord& rec);
  void write_record(const ResultRecord& r);
  void handle_message(Tag tag, const std::string& payload);
  std::vector<std::pair<std::string, std::string>> png_text(const JobRequest& r) const;

  Session& session_;
  const RunOptions& options_;
  StatusFile& status_;
  dist::ControlPlane control_;
  const int rank_;

  Plan plan_;
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::unique_ptr<OutputLock> lock_;  // world rank 0 only: the output folder's, for the whole run
  std::unique_ptr<ResultsLog> log_;   // world rank 0 only
  fs::path out_dir_, images_;
  std::vector<const JobRequest*> todo_;
  int64_t skipped_ = 0;
  std::unique_ptr<pipelines::Pipeline> pipe_;
  std::set<const JobRequest*> runnable_;
  std::vector<Unit> mine_;
  std::unique_ptr<Hdf5Store> store_;

  // The loop's tallies (world rank 0 sums the records of every replica).
  std::unique_ptr<Progress> progress_;
  double stage_sums_[3] = {0, 0, 0};  // encode, denoise, decode over this run's records
  int64_t failed_ = 0, recorded_ = 0;  // recorded_: records of this run (an interrupted one has fewer)
  int finishes_ = 0, interrupted_replicas_ = 0;
  bool interrupted_ = false;
  double compute_s_ = 0, loop_s_ = 0;
  Clock::time_point loop_start_;
};

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
  const int world = session_.world();
  control_.agree([&] {
    const int dp = m.dp > 0 ? m.dp : (world % m.tp == 0 ? world / m.tp : 0);
    if (dp == 0 || m.tp * dp != world) {
      throw ConfigError(fmt::format("{}: parallel.tp {} x parallel.dp {} must equal the number of ranks {}", m.path,
                                    m.tp, m.dp > 0 ? std::to_string(m.dp) : std::string("(world / tp)"), world),
                        true);
    }
    const bool on_cuda = session_.device().device.rfind("cuda", 0) == 0;
    if ((m.device == "cpu" && on_cuda) || (m.device == "cuda" && !on_cuda)) {
      throw ConfigError(fmt::format("{}: parallel.device is '{}' but this rank runs on {} ({}); set --device {}",
                                    m.path, m.device, session_.device().device, session_.device().reason, m.device),
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
    std::error_code ec;
    if (fs::is_directory(out_dir_, ec)) {
      lock_ = OutputLock::acquire(out_dir_.string());
      log_ = std::make_unique<ResultsLog>(out_dir_.string());
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
    fs::create_directories(images_, ec);
    if (ec) throw_io_error(m.path + ": output.dir: cannot create", images_.string(), ec.value());
    if (!lock_) lock_ = OutputLock::acquire(out_dir_.string());
    if (!lock_->unsupported().empty()) {
      spdlog::warn("{}: the file system refuses locks ({}): nothing stops a second run on this output folder; run one "
                   "at a time",
                   lock_->path(), lock_->unsupported());
    }
    for (const fs::path& d : {out_dir_, images_, out_dir_ / "store"}) {
      if (!fs::is_directory(d, ec)) continue;
      for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code fec;
        if (it->is_regular_file(fec) && is_stale_temp(it->path())) {
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

// 3. The pipeline model_index.json names; every request gets its defaults.
void JobRun::load() {
  const Manifest& m = plan_.manifest;
  parallel::TpContext tp{mesh_->tp_rank(), mesh_->tp_size(), mesh_->tp_size() > 1 ? &mesh_->tp_device() : nullptr};
  pipelines::PipelineOptions lo;
  lo.dtype = m.dtype;
  lo.device = session_.device().device;
  lo.shard_text_encoders = m.shard_text_encoders;
  lo.shard_modulation = m.shard_modulation;
  lo.component_base.memory = m.memory;
  spdlog::info("{}", memory::describe(m.memory));
  const auto t0 = Clock::now();
  pipe_ = pipelines::load_pipeline(m.model, tp, lo);
  spdlog::info("loaded {} ({}) in {:.2f} s ({} bytes on this rank)", m.model, pipe_->class_name(), seconds_since(t0),
               pipe_->bytes_loaded());
  for (auto& r : plan_.requests) r.gen = pipe_->with_defaults(r.gen);
}

// Every request to run is checked once (batching, the store and the loop use
// the verdict).
void JobRun::check_requests() {
  for (const JobRequest* r : todo_) {
    try {
      pipe_->check_request(r->gen);
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
    return pipe_->batch_key(r.gen);
  });
  mine_ = assign_units(std::move(units), mesh_->dp_size(),
                       [&](const JobRequest& r) { return pipe_->cost(r.gen); })[static_cast<size_t>(mesh_->dp_rank())];
  if (m.hdf5 || m.latents) {
    std::vector<StoreRequest> srs;
    for (const JobRequest* r : todo_) {
      if (!runnable_.count(r)) continue;
      const auto shape = pipe_->latent_shape(*r->gen.height, *r->gen.width);
      srs.push_back({r, shape[0], shape[1]});
    }
    store_ = std::make_unique<Hdf5Store>(out_dir_.string(), m.hdf5, m.latents, srs, control_, MPI_COMM_WORLD);
  }
}

std::vector<std::pair<std::string, std::string>> JobRun::png_text(const JobRequest& r) const {
  auto t = pipelines::generation_text(r.gen, plan_.manifest.model, plan_.manifest.dtype);
  t.insert(t.begin() + 1, {"id", r.id});
  return t;
}

void JobRun::write_record(const ResultRecord& r) {
  log_->append(r);
  ++recorded_;
  stage_sums_[0] += r.encode_s;
  stage_sums_[1] += r.denoise_s;
  stage_sums_[2] += r.decode_s;
  if (r.status != "done") {
    ++failed_;
    spdlog::warn("request {} failed: {}", r.id, r.error);
  }
  progress_->record(r.status == "done");
}

void JobRun::handle_message(Tag tag, const std::string& payload) {
  if (tag == Tag::Record) {
    write_record(ResultRecord::from_json(nlohmann::json::parse(payload)));
    return;
  }
  ++finishes_;
  if (payload == "interrupted") ++interrupted_replicas_;
}

// The replica's TP rank 0 writes one request's image (PNG) and store data. A
// failure of the file system (disk full, quota, read-only) is an IoError
// naming the path and the errno text: it ends the job, the log stays whole.
void JobRun::write_outputs(const JobRequest& req, const pipelines::GenerationResult& res, ResultRecord& rec) {
  const Manifest& m = plan_.manifest;
  const auto td = Clock::now();
  if (m.png) {
    rec.path = "images/" + req.id + ".png";
    const std::string path = (out_dir_ / rec.path).string();
    // I/O failures (disk full, quota, EFBIG) come as IoError naming the path and the errno text.
    pipelines::write_png(path, res.rgb.data(), static_cast<int>(res.width), static_cast<int>(res.height),
                         png_text(req));
  }
  if (store_) {
    try {
      store_->write(req.id, res.rgb, *res.latents);
    } catch (const CheckpointError& e) {
      throw IoError(fmt::format("cannot write {} into the HDF5 store {}: {}", req.id, store_->path(), e.what()));
    }
    if (!m.png) {
      rec.path = fs::relative(store_->path(), out_dir_).string() + ":" + (m.hdf5 ? "/images/" : "/latents/") + req.id;
    }
  }
  rec.decode_s = res.times.decode_s + seconds_since(td);
}

// One unit on this replica: generate, write the images (TP rank 0), and the
// records to world rank 0.
void JobRun::run_unit(const Unit& unit) {
  const bool leader = mesh_->tp_rank() == 0;
  const auto drain = [&] {
    if (rank_ == 0) control_.poll([&](Tag tag, int, const std::string& p) { handle_message(tag, p); });
  };
  std::vector<ResultRecord> recs(unit.size());
  std::vector<pipelines::GenerationRequest> gens;
  for (size_t k = 0; k < unit.size(); ++k) {
    const JobRequest& req = *unit[k];
    ResultRecord& rec = recs[k];
    rec.id = req.id;
    rec.seed = req.gen.seed;
    rec.height = req.gen.height.value_or(0);
    rec.width = req.gen.width.value_or(0);
    rec.steps = req.gen.steps.value_or(0);
    rec.replica = mesh_->dp_rank();
    gens.push_back(req.gen);
  }
  const auto t0 = Clock::now();
  try {
    // A stop is agreed at every denoise step, not only between requests: a
    // request can take longer than the launcher's grace before its SIGKILL.
    auto results = pipe_->generate_batch(gens, [&](int64_t step, int64_t steps, double) {
      drain();
      if (!agree_stop()) return;
      if (rank_ == 0) {
        spdlog::info("stopping at step {} of {} of {}; it runs again on resume", step + 1, steps, unit.front()->id);
      }
      throw StopAgreed{};
    });
    for (size_t k = 0; k < unit.size(); ++k) {
      const JobRequest& req = *unit[k];
      const auto& res = results[k];
      ResultRecord& rec = recs[k];
      rec.encode_s = res.times.encode_s;
      rec.denoise_s = res.times.denoise_s();
      if (!res.error.empty()) {
        rec.status = "failed";
        rec.error = res.error;
        continue;
      }
      if (leader) write_outputs(req, res, rec);
      rec.status = "done";
    }
  } catch (const StopAgreed&) {
    compute_s_ += seconds_since(t0);
    throw;
  } catch (const RequestError& e) {
    for (auto& rec : recs) {
      rec.status = "failed";
      rec.error = e.what();
    }
  }
  compute_s_ += seconds_since(t0);
  if (leader) {
    for (const auto& rec : recs) {
      if (rank_ == 0) {
        write_record(rec);
      } else {
        control_.send_to_root(Tag::Record, rec.to_json().dump());
      }
    }
  }
  drain();
}

// Whether this replica stops now (SIGTERM / SIGINT on any of its ranks): an
// AllReduce of the flag over the TP group (MPI, a few bytes), so that all its
// ranks stop at the same point. World rank 0 writes the verdict at once.
bool JobRun::agree_stop() {
  at::Tensor stop = at::full({1}, stop_requested() ? 1 : 0, at::TensorOptions().dtype(at::kInt));
  if (mesh_->tp_size() > 1) mesh_->tp().all_reduce(stop, {dist::ReduceOp::Max});
  if (stop.item<int>() == 0) return false;
  if (rank_ == 0) status_.interrupted();
  return true;
}

// 6. Each replica runs its units in order; all TP ranks of a replica run the
//    same unit. Before each unit the TP group agrees whether to stop
//    (SIGTERM / SIGINT). World rank 0 takes every replica's records.
void JobRun::replica_loop() {
  const std::string& mode = options_.progress;
  progress_ = std::make_unique<Progress>(static_cast<int64_t>(plan_.requests.size()), skipped_,
                                         mode == "live" || (mode == "auto" && ::isatty(2)),
                                         mode == "none" ? 1e18 : 10.0);
  loop_start_ = Clock::now();
  for (const Unit& unit : mine_) {
    if (agree_stop()) {
      interrupted_ = true;
      break;
    }
    try {
      run_unit(unit);
    } catch (const StopAgreed&) {
      interrupted_ = true;
      break;
    }
  }
  loop_s_ = seconds_since(loop_start_);
  const bool leader = mesh_->tp_rank() == 0;
  if (leader && rank_ != 0) control_.send_to_root(Tag::Finish, interrupted_ ? "interrupted" : "finished");
  if (interrupted_) ++interrupted_replicas_;
  control_.flush();
  if (rank_ == 0) {
    int expected = 0;
    for (int r = 1; r < session_.world(); ++r) expected += mesh_->layout().coord(r).tp_index == 0 ? 1 : 0;
    while (finishes_ < expected) control_.wait([&](Tag tag, int, const std::string& p) { handle_message(tag, p); });
    progress_->finish();
  }
}

// 7. The store closed (every dataset written is a `done` record), the summary,
//    and one exit code for all ranks.
int JobRun::results() {
  if (store_) {
    std::string done_json;
    if (rank_ == 0) {
      nlohmann::json done = nlohmann::json::array();
      for (const auto& [id, rec] : log_->records()) {
        if (rec.status == "done") done.push_back(id);
      }
      done_json = done.dump();
    }
    control_.broadcast(done_json);
    std::set<std::string> written;
    for (const auto& id : nlohmann::json::parse(done_json)) written.insert(id.get<std::string>());
    const std::string path = store_->finish(written);
    if (rank_ == 0) spdlog::info("HDF5 store: {}", path);
  }
  // Prompt encodes run and saved by the embeddings cache, summed over the
  // replicas (their TP rank 0s: the other ranks of a group encode the same).
  const auto cache = pipe_->prompt_cache_stats();
  const bool leader = mesh_->tp_rank() == 0;
  at::Tensor encodes = at::tensor({leader ? cache.misses : 0, leader ? cache.hits : 0},
                                  at::TensorOptions().dtype(at::kLong));
  mesh_->world().all_reduce(encodes);
  int64_t code = 0;
  if (rank_ == 0) {
    spdlog::info("prompt encodes: {} run, {} saved by the embeddings cache", encodes[0].item<int64_t>(),
                 encodes[1].item<int64_t>());
    const double wall = seconds_since(loop_start_);
    const double total = stage_sums_[0] + stage_sums_[1] + stage_sums_[2];
    const int64_t ran = recorded_;
    auto share = [&](double x) { return total > 0 ? 100 * x / total : 0.0; };
    spdlog::info("summary: {} run ({} failed) in {:.2f} s, {:.3f} img/s; stage shares encode {:.1f}% denoise {:.1f}% "
                 "decode+write {:.1f}%; replica 0 runner overhead {:.2f}% ({:.3f} s of {:.3f} s)",
                 ran, failed_, wall, wall > 0 ? static_cast<double>(ran) / wall : 0.0, share(stage_sums_[0]),
                 share(stage_sums_[1]), share(stage_sums_[2]),
                 loop_s_ > 0 ? 100 * (loop_s_ - compute_s_) / loop_s_ : 0.0, loop_s_ - compute_s_, loop_s_);
    spdlog::info("results: {} | images: {}", log_->path(), images_.string());
    if (interrupted_replicas_ > 0) {
      spdlog::warn("interrupted: {} replica(s) stopped early; rerun the same command to resume (exit code {})",
                   interrupted_replicas_, kExitInterrupted);
      code = kExitInterrupted;
    } else if (failed_ > 0) {
      code = kExitSomeFailed;
    }
  }
  control_.broadcast(code);
  return static_cast<int>(code);
}

}  // namespace

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
