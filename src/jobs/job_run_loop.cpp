// The replica loop of `tprun run` (staged rounds: the encode phase, then
// the units), each unit's outputs and records, and the results. See job_run.h.
#include <unistd.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "dist/communicator.h"
#include "dist/session.h"
#include "jobs/job_run.h"
#include "jobs/staged_phases.h"
#include "jobs/video_output.h"
#include "pipelines/png_image.h"
#include "runtime/error.h"
#include "runtime/out_of_memory.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

// "request 'a'" or "requests 'a', 'b'" (a batch), for messages.
std::string requests_label(const Unit& unit, const std::vector<size_t>& live) {
  std::vector<std::string> ids;
  for (size_t k : live) {
    if (ids.size() == 4) {
      ids.push_back("…");
      break;
    }
    ids.push_back("'" + clip_text(unit[k]->id) + "'");
  }
  return fmt::format("{} {}", live.size() == 1 ? "request" : "requests", fmt::join(ids, ", "));
}

// Out of memory where the job cannot go on without the failed work (`why`).
// Not all_ranks: the process boundary aborts every rank at once (peers in a
// collective would otherwise hang). Exit code 6; what is recorded stays.
[[noreturn]] void end_job_out_of_memory(const RequestError& e, const std::string& why, const char* from) {
  throw Error(Error::Kind::Request,
              fmt::format("{}. {}, so the job ends here; rerun the same command once it fits and the job resumes "
                          "from {} (what is recorded is kept)",
                          e.what(), why, from));
}

}  // namespace

// A staged round's encode phase: the texts its requests need that the
// embedding cache lacks are encoded (the text encoders loaded for it), then
// the transformer and VAE are loaded in their place. False: stopped.
bool JobRun::encode_phase(const std::vector<Unit>& round) {
  int64_t reused = 0;
  const std::vector<PendingText> pending = pending_texts(*pipe_, round, *embeddings_, reused);
  texts_reused_ += reused;
  int64_t requests = 0;
  for (const Unit& u : round) requests += static_cast<int64_t>(u.size());
  round_encode_s_ = 0;
  if (!pending.empty()) {
    if (!encoders_loaded_) load_pipeline(true);
    EncodeRound er;
    try {
      er = encode_texts(*pipe_, pending, mesh_->dp_rank(), *embeddings_, *mesh_, [&] {
        drain();
        return agree_stop();
      });
    } catch (...) {
      // Which text ran out is not known here, and the encoders may be
      // sharded over the group: out of memory ends the job (exit 6).
      const RequestError e = out_of_memory_error(
          std::current_exception(),
          fmt::format("the staged encode phase (replica {}, {} text(s) of {} request(s) from '{}')", mesh_->dp_rank(),
                      pending.size(), requests, clip_text(round.front().front()->id)),
          session_.device().device);
      end_job_out_of_memory(e, "Which text it was is not known here and the encoders may be sharded over the TP "
                               "group", "this round's requests");
    }
    texts_encoded_ += er.encoded;
    encode_failed_.insert(er.failed.begin(), er.failed.end());
    round_encode_s_ = requests > 0 ? er.seconds / static_cast<double>(requests) : 0;
    if (mesh_->tp_rank() == 0) {
      spdlog::info("replica {}: {} text(s) encoded in {:.2f} s, {} reused from {}", mesh_->dp_rank(), er.encoded,
                   er.seconds, reused, embeddings_->folder());
    }
    if (er.stopped) {
      if (rank_ == 0) spdlog::info("stopping in the encode phase; what was encoded is kept for the rerun");
      return false;
    }
  }
  if (encoders_loaded_) load_pipeline(false);
  return true;
}

std::vector<std::pair<std::string, std::string>> JobRun::png_text(const JobRequest& r) const {
  auto t = pipelines::generation_text(r.gen, plan_.manifest.model, plan_.manifest.dtype);
  t.insert(t.begin() + 1, {"id", r.id});
  return t;
}

std::string JobRun::output_frames_problem(const JobRequest& r) const {
  const Manifest& m = plan_.manifest;
  const int64_t frames = r.gen.frame_count();
  if (m.png && frames != 1) {
    return fmt::format("frames: {} frames cannot go into [output] formats' png: {}; formats = [\"mp4\"], "
                       "[\"frames\"] or [\"hdf5\"] hold frame sequences",
                       frames, png_frames_problem(frames));
  }
  if (m.mp4) {
    const int64_t height = r.gen.height.value_or(0), width = r.gen.width.value_or(0);
    if (const std::string why = mp4_size_problem(height, width); !why.empty()) {
      return fmt::format("{}: {} x {} cannot go into [output] formats' mp4: {}", height % 2 != 0 ? "height" : "width",
                         height, width, why);
    }
  }
  return "";
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
    // I/O failures (disk full, quota, EFBIG) come as IoError naming the path and the errno text. images/ is
    // still a real folder, and the PNG goes in as a new file or over one tprun wrote (output_folder.h): a
    // file put there since the run was checked ends the job (ConfigError naming it), never replaced.
    check_output_entry(out_dir_, "images", EntryKind::Folder);
    write_png_output(path, res.rgb.data(), static_cast<int>(res.width), static_cast<int>(res.height), res.frames,
                     png_text(req));
  }
  if (m.mp4 || m.frame_pngs) {
    // A video (or a one-frame result of a video pipeline) as an MP4 and / or PNG frames: videos/ made or
    // still a real folder, and each file goes in as a new file or over one tprun wrote (output_folder.h).
    make_output_folder(out_dir_, "videos");
    const VideoFrames v{res.rgb.data(), res.frames, res.height, res.width};
    if (m.mp4) {
      if (!req.gen.fps) {
        throw Error(Error::Kind::Internal, fmt::format("request {}: the pipeline left fps unset for a video "
                                                       "(RequestOptions::request_defaults fills it)",
                                                       req.id));
      }
      write_mp4_output((out_dir_ / mp4_output_rel(req.id)).string(), v, *req.gen.fps);
      if (!m.png) rec.path = mp4_output_rel(req.id);
    }
    if (m.frame_pngs) {
      write_frame_pngs(make_output_folder(out_dir_ / "videos", req.id), v, png_text(req));
      if (!m.png && !m.mp4) rec.path = frames_output_rel(req.id) + "/" + frame_png_name(0);
    }
  }
  if (store_) {
    try {
      store_->write(req.id, res.rgb, *res.latents);
    } catch (const CheckpointError& e) {
      throw IoError(fmt::format("cannot write {} into the HDF5 store {}: {}", req.id, store_->path(), e.what()));
    }
    if (!m.png && !m.mp4 && !m.frame_pngs) {
      rec.path = fs::relative(store_->path(), out_dir_).string() + ":" + (m.hdf5 ? "/images/" : "/latents/") + req.id;
    }
  }
  rec.decode_s = res.times.decode_s + seconds_since(td);
}

// World rank 0 takes the records and finishes the replicas sent so far.
void JobRun::drain() {
  if (rank_ == 0) control_.poll([&](Tag tag, int, const std::string& p) { handle_message(tag, p); });
}

// One unit between its parts (Pipeline::start_batch, advance_batch,
// finish_in_flight): its records, the requests that run and the batch in flight.
struct JobRun::UnitWork {
  const Unit* unit = nullptr;
  std::vector<ResultRecord> recs;
  std::vector<size_t> live;  // the unit's requests that run (staged: those whose texts were encoded)
  std::vector<pipelines::GenerationRequest> gens;
  std::unique_ptr<pipelines::Pipeline::InFlight> batch;
  bool failed = false;  // a part raised a RequestError: every live request failed with it
  double compute_s = 0;
};

// The unit's records and the requests that run.
JobRun::UnitWork JobRun::begin_unit(const Unit& unit) {
  UnitWork w;
  w.unit = &unit;
  w.recs.resize(unit.size());
  for (size_t k = 0; k < unit.size(); ++k) {
    const JobRequest& req = *unit[k];
    ResultRecord& rec = w.recs[k];
    rec.id = req.id;
    rec.seed = req.gen.seed;
    rec.height = req.gen.height.value_or(0);
    rec.width = req.gen.width.value_or(0);
    rec.steps = req.gen.steps.value_or(0);
    rec.frames = req.gen.frame_count();
    if (rec.frames != 1) rec.fps = req.gen.fps.value_or(0);
    rec.replica = mesh_->dp_rank();
    rec.loras = lora_records(req, plan_.manifest, lora_hashes_);
    rec.encode_s = staged_ ? round_encode_s_ : 0;
    if (auto failed = encode_failed_.find(req.id); failed != encode_failed_.end()) {
      rec.status = "failed";
      rec.error = failed->second;
      continue;
    }
    if (auto refused = output_refused_.find(req.id); refused != output_refused_.end()) {  // before any compute
      rec.status = "failed";
      rec.error = refused->second;
      continue;
    }
    w.live.push_back(k);
    w.gens.push_back(staged_ && runnable_.count(&req) ? with_embeddings(*pipe_, req.gen, *embeddings_) : req.gen);
  }
  return w;
}

// One part of the unit's batch: a stop agreed at any denoise step (a request
// can take longer than the launcher's grace before its SIGKILL) ends the
// loop; out of memory fails the unit at tp 1 (the batch goes on with the
// caches given back) and ends the job in a larger TP group; a RequestError
// fails every live request of the unit.
void JobRun::unit_part(UnitWork& w, const std::function<void()>& part) {
  if (w.failed || w.live.empty()) return;
  const auto t0 = Clock::now();
  try {
    try {
      part();
    } catch (const StopAgreed&) {
      throw;
    } catch (...) {
      const RequestError e = out_of_memory_error(std::current_exception(), requests_label(*w.unit, w.live),
                                                 session_.device().device);
      if (mesh_->tp_size() > 1) {
        end_job_out_of_memory(e, fmt::format("On TP rank {} of {} (replica {}) the group cannot go on in step: its "
                                             "other ranks wait in the same forward",
                                             mesh_->tp_rank(), mesh_->tp_size(), mesh_->dp_rank()),
                              w.live.size() == 1 ? "this request" : "these requests");
      }
      throw e;
    }
  } catch (const StopAgreed&) {
    compute_s_ += seconds_since(t0);
    throw;
  } catch (const RequestError& e) {
    w.failed = true;
    w.batch.reset();
    for (size_t k : w.live) {
      w.recs[k].status = "failed";
      w.recs[k].error = e.what();
    }
  }
  compute_s_ += seconds_since(t0);
}

pipelines::StepCallback JobRun::stop_check(const Unit& unit) {
  return [this, &unit](int64_t step, int64_t steps, double) {
    drain();
    if (!agree_stop()) return;
    if (rank_ == 0) {
      spdlog::info("stopping at step {} of {} of {}; it runs again on resume", step + 1, steps, unit.front()->id);
    }
    throw StopAgreed{};
  };
}

// The adapter set the unit runs with: a switch counted where it differs from
// the set in force (the pipeline applies it: its batch key holds the set).
void JobRun::note_lora_set(const Unit& unit) {
  std::string key = lora::lora_set_key(unit.front()->gen.lora_set());
  if (key == lora_in_force_) return;
  ++lora_switches_;
  lora_in_force_ = std::move(key);
}

// The batch started and run through `stage` (weight stages: each in its turn).
void JobRun::unit_stage(UnitWork& w, int64_t stage) {
  if (!w.failed && !w.live.empty()) note_lora_set(*w.unit);
  unit_part(w, [&] {
    if (!w.batch) w.batch = pipe_->start_batch(w.gens, stop_check(*w.unit));
    pipe_->advance_batch(*w.batch, stage);
  });
}

// The results: the outputs written (TP rank 0) and the records to world rank 0.
void JobRun::end_unit(UnitWork& w) {
  const bool leader = mesh_->tp_rank() == 0;
  std::vector<pipelines::GenerationResult> results;
  unit_part(w, [&] {
    if (!w.batch) w.batch = pipe_->start_batch(w.gens, stop_check(*w.unit));
    results = pipe_->finish_in_flight(*w.batch);
    w.batch.reset();
  });
  if (!w.failed && !w.live.empty()) {
    for (size_t i = 0; i < w.live.size(); ++i) {
      const JobRequest& req = *(*w.unit)[w.live[i]];
      const auto& res = results[i];
      ResultRecord& rec = w.recs[w.live[i]];
      rec.encode_s += res.times.encode_s;
      rec.denoise_s = res.times.denoise_s();
      if (!res.error.empty()) {
        rec.status = "failed";
        rec.error = res.error;
        continue;
      }
      if (leader) write_outputs(req, res, rec);
      rec.status = "done";
    }
  }
  if (leader) {
    for (const auto& rec : w.recs) {
      if (rank_ == 0) {
        write_record(rec);
      } else {
        control_.send_to_root(Tag::Record, rec.to_json().dump());
      }
    }
  }
  drain();
}

// One unit on this replica: generate (every weight stage in turn), write the
// images (TP rank 0), and the records to world rank 0. Staged: each
// request's embeddings come from the cache.
void JobRun::run_unit(const Unit& unit) {
  UnitWork w = begin_unit(unit);
  for (int64_t s = 0; s < pipe_->weight_stages(); ++s) unit_stage(w, s);
  end_unit(w);
}

// A round's units when the pipeline holds its weights one stage at a time
// (experts staged): every unit through stage 0, then every one through
// stage 1, ..., then each finished, so the weights swap once per stage a
// round. A stop agreed between units or at a step drops the round's batches
// in flight (they run again on resume: nothing of them was recorded).
void JobRun::run_round_by_stage(const std::vector<Unit>& round) {
  std::vector<UnitWork> works;
  works.reserve(round.size());
  for (const Unit& unit : round) works.push_back(begin_unit(unit));
  for (int64_t s = 0; s < pipe_->weight_stages(); ++s) {
    for (UnitWork& w : works) {
      if (agree_stop()) throw StopAgreed{};
      unit_stage(w, s);
    }
  }
  for (UnitWork& w : works) end_unit(w);
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
  // Staged: rounds of schedule.stage_requests requests, each encoded before it runs.
  // Experts staged: rounds too (of kExpertRoundRequests where stage_requests is 0), each run stage by stage.
  const bool by_stage = pipe_->weight_stages() > 1;
  const int64_t round_requests = by_stage && plan_.manifest.stage_requests == 0 ? kExpertRoundRequests
                                                                               : plan_.manifest.stage_requests;
  const std::vector<std::vector<Unit>> rounds = staged_ || by_stage ? stage_rounds(mine_, round_requests)
                                                                    : std::vector<std::vector<Unit>>{mine_};
  for (const auto& round : rounds) {
    if (staged_ && !encode_phase(round)) {
      interrupted_ = true;
      break;
    }
    if (by_stage) {
      try {
        run_round_by_stage(round);
      } catch (const StopAgreed&) {
        interrupted_ = true;
      }
      if (interrupted_) break;
      continue;
    }
    for (const Unit& unit : round) {
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
    if (interrupted_) break;
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
  // Staged: the distinct texts encoded and those the on-disk cache held.
  const auto cache = pipe_->prompt_cache_stats();
  const bool leader = mesh_->tp_rank() == 0;
  const int64_t run = staged_ ? texts_encoded_ : cache.misses, saved = staged_ ? texts_reused_ : cache.hits;
  at::Tensor encodes = at::tensor({leader ? run : 0, leader ? saved : 0, leader ? lora_switches_ : 0},
                                  at::TensorOptions().dtype(at::kLong));
  mesh_->world().all_reduce(encodes);
  int64_t code = 0;
  if (rank_ == 0) {
    spdlog::info("prompt encodes: {} run, {} saved by the {}", encodes[0].item<int64_t>(), encodes[1].item<int64_t>(),
                 staged_ ? "embedding cache of the output folder" : "embeddings cache");
    const double wall = seconds_since(loop_start_);
    const double total = stage_sums_[0] + stage_sums_[1] + stage_sums_[2];
    const int64_t ran = recorded_;
    auto share = [&](double x) { return total > 0 ? 100 * x / total : 0.0; };
    // A job with adapters: its distinct sets (this run's requests) and the
    // switches between them, summed over the replicas (each starts from the base model).
    const std::string lora_part =
        job_has_loras() ? fmt::format("; LoRA adapter sets {} distinct, {} switch(es)", distinct_lora_sets(todo_).size(),
                                      encodes[2].item<int64_t>())
                        : "";
    spdlog::info("summary: {} run ({} failed) in {:.2f} s, {:.3f} img/s; stage shares encode {:.1f}% denoise {:.1f}% "
                 "decode+write {:.1f}%; replica 0 runner overhead {:.2f}% ({:.3f} s of {:.3f} s){}",
                 ran, failed_, wall, wall > 0 ? static_cast<double>(ran) / wall : 0.0, share(stage_sums_[0]),
                 share(stage_sums_[1]), share(stage_sums_[2]),
                 loop_s_ > 0 ? 100 * (loop_s_ - compute_s_) / loop_s_ : 0.0, loop_s_ - compute_s_, loop_s_, lora_part);

    if (plan_.manifest.mp4 || plan_.manifest.frame_pngs) {
      spdlog::info("results: {} | videos: {}", log_->path(), (out_dir_ / "videos").string());
    } else {
      spdlog::info("results: {} | images: {}", log_->path(), images_.string());
    }
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

}  // namespace tprun::jobs
