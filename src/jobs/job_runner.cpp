// The batch job: validation and verdict, resume, cost-balanced assignment
// over dp replicas, the per-replica loop, one results writer. See job_runner.h.
#include "jobs/job_runner.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "dist/communicator.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "jobs/hdf5_store.h"
#include "jobs/progress.h"
#include "jobs/request_list.h"
#include "jobs/results_log.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"
#include "runtime/session.h"

namespace tprun::jobs {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_stop{0};

extern "C" void on_stop_signal(int) { g_stop.store(1); }

constexpr int kTagRecord = 11;
constexpr int kTagFinish = 12;

void bcast_string(std::string& s, MPI_Comm comm) {
  uint64_t n = s.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm);
  s.resize(n);
  if (n > 0) MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
}

// Runs `fn` on world rank 0; its tprun::Error (if any) is broadcast and
// raised on every rank alike, so all ranks exit with the same message.
void agree(int rank, const std::function<void()>& fn) {
  int kind = -1;
  std::string message;
  if (rank == 0) {
    try {
      fn();
    } catch (const Error& e) {
      kind = static_cast<int>(e.kind());
      message = e.what();
    }
  }
  MPI_Bcast(&kind, 1, MPI_INT, 0, MPI_COMM_WORLD);
  bcast_string(message, MPI_COMM_WORLD);
  if (kind >= 0) throw Error(static_cast<Error::Kind>(kind), message, true);
}

struct Plan {
  Manifest manifest;
  std::vector<JobRequest> requests;
};

Plan read_plan(const RunOptions& o) {
  Plan p;
  p.manifest = parse_manifest(o.manifest, o.overrides);
  check_paths(p.manifest);
  p.requests = read_requests(p.manifest.requests, p.manifest.defaults);
  if (o.shard_count > 0) {
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

// A unit of work: one request, or a batch of same-shape requests.
using Unit = std::vector<const JobRequest*>;

double unit_cost(const Unit& u) {
  double c = 0;
  for (const JobRequest* r : u) c += r->cost();
  return c;
}

// Batches of up to `batch_size` requests that share a shape (size, steps,
// guidance, true CFG, max_sequence_length), formed in id order from the
// requests to run — so a batch's members depend on the manifest and on what
// is left to run, never on dp, tp or the order of the file. Requests the
// pipeline refuses (`runnable` false) stay alone and fail fast.
std::vector<Unit> make_units(const std::vector<const JobRequest*>& todo, int64_t batch_size,
                             const std::function<bool(const JobRequest&)>& runnable) {
  std::vector<const JobRequest*> order = todo;
  std::sort(order.begin(), order.end(), [](const JobRequest* a, const JobRequest* b) { return a->id < b->id; });
  std::vector<Unit> units;
  std::map<std::string, size_t> open;  // shape key -> index of its unfilled batch
  for (const JobRequest* r : order) {
    const auto& g = r->gen;
    if (batch_size <= 1 || !runnable(*r)) {
      units.push_back({r});
      continue;
    }
    const bool cfg = g.true_cfg_scale > 1.0 && g.negative_prompt.has_value();
    const std::string key = fmt::format("{}x{}/{}/{}/{}/{}/{}", g.height, g.width, g.steps, g.guidance,
                                        g.true_cfg_scale, g.max_sequence_length, cfg);
    auto it = open.find(key);
    if (it == open.end() || static_cast<int64_t>(units[it->second].size()) >= batch_size) {
      open[key] = units.size();
      units.push_back({r});
    } else {
      units[it->second].push_back(r);
    }
  }
  return units;
}

// LPT: largest cost first onto the least-loaded replica (ties: lowest index;
// equal costs in order of the first id).
std::vector<std::vector<Unit>> assign(std::vector<Unit> units, int replicas) {
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    if (unit_cost(a) != unit_cost(b)) return unit_cost(a) > unit_cost(b);
    return a.front()->id < b.front()->id;
  });
  std::vector<double> load(static_cast<size_t>(replicas), 0.0);
  std::vector<std::vector<Unit>> out(static_cast<size_t>(replicas));
  for (auto& u : units) {
    const size_t best = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[best] += unit_cost(u);
    out[best].push_back(std::move(u));
  }
  return out;
}

pipelines::GenerationRequest to_generation(const GenerationParams& p) {
  pipelines::GenerationRequest g;
  g.prompt = p.prompt;
  g.negative_prompt = p.negative_prompt;
  g.height = p.height;
  g.width = p.width;
  g.steps = p.steps;
  g.guidance = p.guidance;
  g.true_cfg_scale = p.true_cfg_scale;
  g.seed = p.seed;
  g.max_sequence_length = p.max_sequence_length;
  return g;
}

std::vector<std::pair<std::string, std::string>> png_text(const JobRequest& r, const Manifest& m) {
  auto t = pipelines::generation_text(to_generation(r.gen), m.model, m.dtype);
  t.insert(t.begin() + 1, {"id", r.id});
  return t;
}

}  // namespace

void parse_shard(const std::string& text, RunOptions& o) {
  auto env_int = [](const char* name) -> long {
    const char* v = std::getenv(name);
    if (!v || !*v) throw ConfigError(fmt::format("--shard slurm: {} is not set (not a Slurm job array task)", name), true);
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0') throw ConfigError(fmt::format("--shard slurm: {}='{}' is not a number", name, v), true);
    return x;
  };
  long index = 0, count = 0;
  if (text == "slurm") {
    index = env_int("SLURM_ARRAY_TASK_ID") - env_int("SLURM_ARRAY_TASK_MIN");
    count = env_int("SLURM_ARRAY_TASK_COUNT");
  } else {
    const size_t slash = text.find('/');
    char* end = nullptr;
    if (slash == std::string::npos) throw ConfigError(fmt::format("--shard '{}': expected I/N or 'slurm'", text), true);
    index = std::strtol(text.c_str(), &end, 10);
    if (end != text.c_str() + slash) throw ConfigError(fmt::format("--shard '{}': expected I/N or 'slurm'", text), true);
    count = std::strtol(text.c_str() + slash + 1, &end, 10);
    if (*end != '\0') throw ConfigError(fmt::format("--shard '{}': expected I/N or 'slurm'", text), true);
  }
  if (count < 1 || index < 0 || index >= count) {
    throw ConfigError(fmt::format("--shard {}: chunk {} of {} is out of range (0 <= I < N)", text, index, count), true);
  }
  o.shard_index = static_cast<int>(index);
  o.shard_count = static_cast<int>(count);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() { return g_stop.load() != 0; }

int run_job(Session& session, const RunOptions& options) {
  const int rank = session.rank();
  const int world = session.world();

  if (rank == 0) {
    if (const char* restarts = std::getenv("SLURM_RESTART_COUNT")) {
      spdlog::info("Slurm job {} restart count {} (requeued: finished requests are kept)",
                   std::getenv("SLURM_JOB_ID") ? std::getenv("SLURM_JOB_ID") : "?", restarts);
    }
    if (options.shard_count > 0) spdlog::info("chunk {} of {} of the requests", options.shard_index, options.shard_count);
  }

  // 1. Validation on rank 0, one verdict for all.
  Plan plan;
  agree(rank, [&] { plan = read_plan(options); });
  if (rank != 0) plan = read_plan(options);
  const Manifest& m = plan.manifest;
  agree(rank, [&] {
    const int dp = m.dp > 0 ? m.dp : (world % m.tp == 0 ? world / m.tp : 0);
    if (dp == 0 || m.tp * dp != world) {
      throw ConfigError(fmt::format("{}: parallel.tp {} x parallel.dp {} must equal the number of ranks {}", m.path,
                                    m.tp, m.dp > 0 ? std::to_string(m.dp) : std::string("(world / tp)"), world),
                        true);
    }
    const bool on_cuda = session.device().device.rfind("cuda", 0) == 0;
    if ((m.device == "cpu" && on_cuda) || (m.device == "cuda" && !on_cuda)) {
      throw ConfigError(fmt::format("{}: parallel.device is '{}' but this rank runs on {} ({}); set --device {}",
                                    m.path, m.device, session.device().device, session.device().reason, m.device),
                        true);
    }
  });

  // 2. Mesh.
  dist::MeshSpec spec;
  spec.tp = m.tp;
  spec.dp = m.dp;
  spec.allow_cross_node_tp = m.allow_cross_node_tp;
  auto mesh = session.make_mesh(spec);
  const bool leader = mesh->tp_rank() == 0;
  const int replica = mesh->dp_rank();

  // 3. Resume (rank 0): what is done, what runs; the log rewritten.
  std::unique_ptr<ResultsLog> log;
  const fs::path out_dir(m.output_dir);
  const fs::path images = out_dir / "images";
  std::string todo_json;
  int64_t skipped = 0;
  agree(rank, [&] {
    std::error_code ec;
    fs::create_directories(images, ec);
    if (ec) throw ConfigError(fmt::format("{}: output.dir: cannot create {}: {}", m.path, images.string(), ec.message()), true);
    for (const fs::path& d : {out_dir, images, out_dir / "store"}) {
      if (!fs::is_directory(d)) continue;
      for (const auto& e : fs::directory_iterator(d)) {
        if (e.is_regular_file() && is_stale_temp(e.path())) {
          spdlog::info("removing a temporary file left by an interrupted run: {}", e.path().string());
          fs::remove(e.path(), ec);
        }
      }
    }
    log = std::make_unique<ResultsLog>(out_dir.string());
    if (log->torn_lines() > 0) {
      spdlog::warn("{}: dropped {} torn line(s) left by an interrupted writer", log->path(), log->torn_lines());
    }
    const bool use_store = m.hdf5 || m.latents;
    const std::set<std::string> stored =
        use_store ? Hdf5Store::stored_ids(out_dir.string(), m.hdf5, m.latents) : std::set<std::string>{};
    nlohmann::json todo = nlohmann::json::array();
    std::set<std::string> rerun;
    for (const auto& r : plan.requests) {
      auto it = log->records().find(r.id);
      if (it != log->records().end()) {
        const auto& rec = it->second;
        const bool image_ok = (!m.png || fs::is_regular_file(images / (r.id + ".png"))) &&
                              (!use_store || stored.count(r.id) != 0);
        if (rec.status == "done" && image_ok) {
          ++skipped;
          continue;
        }
        if (rec.status == "failed" && !options.retry_failed) {
          ++skipped;
          continue;
        }
        rerun.insert(r.id);
      }
      todo.push_back(r.id);
    }
    log->begin(rerun);
    todo_json = todo.dump();
  });
  bcast_string(todo_json, MPI_COMM_WORLD);
  MPI_Bcast(&skipped, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::map<std::string, const JobRequest*> by_id;
  for (const auto& r : plan.requests) by_id[r.id] = &r;
  std::vector<const JobRequest*> todo;
  for (const auto& id : nlohmann::json::parse(todo_json)) todo.push_back(by_id.at(id.get<std::string>()));
  if (rank == 0) {
    spdlog::info("job {}: {} requests, {} already finished, {} to run on {} replica(s) x tp {}", m.path,
                 plan.requests.size(), skipped, todo.size(), mesh->dp_size(), m.tp);
  }

  // 4. Model.
  parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};
  pipelines::PipelineLoadOptions lo;
  lo.dtype = m.dtype;
  lo.device = session.device().device;
  const auto tl = Clock::now();
  auto pipe = pipelines::FluxPipeline::load(m.model, tp, lo);
  spdlog::info("loaded {} in {:.2f} s ({} bytes on this rank)", m.model,
               std::chrono::duration<double>(Clock::now() - tl).count(), pipe.bytes_loaded());

  // Which requests the pipeline accepts (checked once: batching and the store use it).
  std::set<const JobRequest*> runnable;
  for (const JobRequest* r : todo) {
    try {
      pipe.check_request(to_generation(r->gen));
      runnable.insert(r);
    } catch (const RequestError&) {
      // fails without output; recorded `failed` by its replica
    }
  }
  // Units of work (batches of same-shape requests) and this replica's share.
  const auto mine = assign(make_units(todo, m.batch_size, [&](const JobRequest& r) { return runnable.count(&r) != 0; }),
                           mesh->dp_size())[static_cast<size_t>(replica)];

  // The HDF5 store of this run (collective): a dataset per request that can run.
  std::unique_ptr<Hdf5Store> store;
  if (m.hdf5 || m.latents) {
    std::vector<StoreRequest> srs;
    for (const JobRequest* r : todo) {
      if (!runnable.count(r)) continue;
      const auto shape = pipe.packed_latent_shape(r->gen.height, r->gen.width);
      srs.push_back({r, shape[0], shape[1]});
    }
    store = std::make_unique<Hdf5Store>(out_dir.string(), m.hdf5, m.latents, srs, MPI_COMM_WORLD);
  }

  // 5. The loop; world rank 0 writes results.
  MPI_Comm results_comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &results_comm);
  const std::string mode = options.progress;
  Progress progress(static_cast<int64_t>(plan.requests.size()), skipped,
                    mode == "live" || (mode == "auto" && ::isatty(2)), mode == "none" ? 1e18 : 10.0);
  int interrupted_replicas = 0;
  double sums[3] = {0, 0, 0};  // encode, denoise, decode over this run's records
  int64_t failed = 0;
  auto write_record = [&](const ResultRecord& r) {
    log->append(r);
    sums[0] += r.encode_s;
    sums[1] += r.denoise_s;
    sums[2] += r.decode_s;
    if (r.status != "done") {
      ++failed;
      spdlog::warn("request {} failed: {}", r.id, r.error);
    }
    progress.record(r.status == "done");
  };
  int finishes = 0;
  auto handle = [&](const MPI_Status& st) {
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string buf(static_cast<size_t>(n), '\0');
    MPI_Recv(buf.data(), n, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, results_comm, MPI_STATUS_IGNORE);
    if (st.MPI_TAG == kTagRecord) {
      write_record(ResultRecord::from_json(nlohmann::json::parse(buf)));
    } else {
      ++finishes;
      if (buf == "interrupted") ++interrupted_replicas;
    }
  };
  auto drain = [&] {
    if (rank != 0) return;
    while (true) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, results_comm, &flag, &st);
      if (!flag) return;
      handle(st);
    }
  };
  std::deque<std::pair<std::string, MPI_Request>> sends;
  auto send = [&](const std::string& payload, int tag) {
    sends.emplace_back(payload, MPI_REQUEST_NULL);
    auto& s = sends.back();
    MPI_Isend(s.first.data(), static_cast<int>(s.first.size()), MPI_CHAR, 0, tag, results_comm, &s.second);
  };

  bool interrupted = false;
  double compute_s = 0;
  const auto loop_start = Clock::now();
  for (const Unit& unit : mine) {
    at::Tensor stop = at::full({1}, stop_requested() ? 1 : 0, at::TensorOptions().dtype(at::kInt));
    if (mesh->tp_size() > 1) mesh->tp().all_reduce(stop, {dist::ReduceOp::Max});
    if (stop.item<int>() != 0) {
      interrupted = true;
      break;
    }
    std::vector<ResultRecord> recs(unit.size());
    std::vector<pipelines::GenerationRequest> gens;
    for (size_t k = 0; k < unit.size(); ++k) {
      const JobRequest& req = *unit[k];
      ResultRecord& rec = recs[k];
      rec.id = req.id;
      rec.seed = req.gen.seed;
      rec.height = req.gen.height;
      rec.width = req.gen.width;
      rec.steps = req.gen.steps;
      rec.replica = replica;
      gens.push_back(to_generation(req.gen));
    }
    const auto t0 = Clock::now();
    try {
      auto results = pipe.generate_batch(gens, [&](int64_t, int64_t, double) { drain(); });
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
        if (leader) {
          const auto td = Clock::now();
          if (m.png) {
            rec.path = "images/" + req.id + ".png";
            pipelines::write_png((out_dir / rec.path).string(), res.rgb.data(), static_cast<int>(res.width),
                                 static_cast<int>(res.height), png_text(req, m));
          }
          if (store) {
            store->write(req.id, res.rgb, *res.latents);
            if (!m.png) {
              rec.path =
                  fs::relative(store->path(), out_dir).string() + ":" + (m.hdf5 ? "/images/" : "/latents/") + req.id;
            }
          }
          rec.decode_s = res.times.decode_s + std::chrono::duration<double>(Clock::now() - td).count();
        }
        rec.status = "done";
      }
    } catch (const RequestError& e) {
      for (auto& rec : recs) {
        rec.status = "failed";
        rec.error = e.what();
      }
    }
    compute_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (leader) {
      for (const auto& rec : recs) {
        if (rank == 0) {
          write_record(rec);
        } else {
          send(rec.to_json().dump(), kTagRecord);
        }
      }
    }
    drain();
  }
  const double loop_s = std::chrono::duration<double>(Clock::now() - loop_start).count();
  if (leader && rank != 0) send(interrupted ? "interrupted" : "finished", kTagFinish);
  if (interrupted) ++interrupted_replicas;
  for (auto& s : sends) MPI_Wait(&s.second, MPI_STATUS_IGNORE);
  if (rank == 0) {
    int expected = 0;
    for (int r = 1; r < world; ++r) expected += mesh->layout().coord(r).tp_index == 0 ? 1 : 0;
    while (finishes < expected) {
      MPI_Status st;
      MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, results_comm, &st);
      handle(st);
    }
    progress.finish();
  }
  MPI_Comm_free(&results_comm);
  if (store) {
    // Every dataset that was written is a `done` record rank 0 holds.
    std::string done_json;
    if (rank == 0) {
      nlohmann::json done = nlohmann::json::array();
      for (const auto& [id, rec] : log->records()) {
        if (rec.status == "done") done.push_back(id);
      }
      done_json = done.dump();
    }
    bcast_string(done_json, MPI_COMM_WORLD);
    std::set<std::string> written;
    for (const auto& id : nlohmann::json::parse(done_json)) written.insert(id.get<std::string>());
    const std::string path = store->finish(written);
    if (rank == 0) spdlog::info("HDF5 store: {}", path);
  }

  // 6. Summary and one exit code for all ranks.
  int code = 0;
  if (rank == 0) {
    const double wall = std::chrono::duration<double>(Clock::now() - loop_start).count();
    const double total = sums[0] + sums[1] + sums[2];
    const int64_t ran = static_cast<int64_t>(todo.size());
    spdlog::info("summary: {} run ({} failed) in {:.2f} s, {:.3f} img/s; stage shares encode {:.1f}% denoise {:.1f}% "
                 "decode+write {:.1f}%; replica 0 runner overhead {:.2f}% ({:.3f} s of {:.3f} s)",
                 ran, failed, wall, wall > 0 ? static_cast<double>(ran) / wall : 0.0,
                 total > 0 ? 100 * sums[0] / total : 0.0, total > 0 ? 100 * sums[1] / total : 0.0,
                 total > 0 ? 100 * sums[2] / total : 0.0, loop_s > 0 ? 100 * (loop_s - compute_s) / loop_s : 0.0,
                 loop_s - compute_s, loop_s);
    spdlog::info("results: {} | images: {}", log->path(), images.string());
    if (interrupted_replicas > 0) {
      spdlog::warn("interrupted: {} replica(s) stopped early; rerun the same command to resume (exit code {})",
                   interrupted_replicas, kExitInterrupted);
      code = kExitInterrupted;
    } else if (failed > 0) {
      code = kExitSomeFailed;
    }
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return code;
}

}  // namespace tprun::jobs
