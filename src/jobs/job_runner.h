#pragma once
// `tprun run MANIFEST`: the batch job.
//
//  1. Rank 0 parses and validates the manifest and the requests file (and
//     that the model folder exists) and broadcasts the verdict: a bad input
//     ends every rank with the same message before any model is loaded and
//     before anything is written.
//  2. The phases and the mesh: with parallel.tp = "auto" or schedule.phases =
//     "auto", rank 0 asks the fit planner (jobs/job_fit.h; configs and
//     headers only) for tp and for "together" or "staged", logs its table
//     and broadcasts the choice. Then dp replicas x tp groups. The output folder must not be the
//     model folder or inside it; one that exists is locked by rank 0 now
//     (OutputLock: a second run on it is refused on every rank, naming the
//     holder's pid and host) and its results.jsonl read. Nothing tprun makes
//     inside it (images/, store/, embeddings/, results.jsonl, the --shard
//     chunk folder) may be a symlink, and every request that will run again
//     must find at images/<id>.png nothing or a PNG tprun wrote: refused on
//     every rank before any weight loads, naming the file.
//  3. The model loads. Only then (a run that fails earlier leaves nothing
//     behind) rank 0 creates the output folder, takes the lock if it has not
//     yet, and reads results.jsonl: requests recorded `done` whose outputs are
//     complete (PNG signature to IEND; the HDF5 datasets present in a finished
//     store file) are skipped, `failed` ones too unless retry_failed; stale
//     temporary files of a killed run are removed (under the lock only); the
//     log is rewritten without the ids that run again (no id is ever recorded
//     `done` twice). The list of requests to run is broadcast.
//  4. Scheduling: static, by cost. With output.batch_size > 1, requests of one
//     shape (size, steps, guidance, true CFG, max_sequence_length) are first
//     grouped in id order into batches of up to batch_size, which the replica
//     denoises together (DiffusionPipeline::generate_batch); a batch's members so
//     depend on the manifest and what is left to run, never on dp, tp or order.
//     Each unit's cost is known up front (pixels x steps x forwards per step);
//     longest-processing-time-first assignment to the least-loaded replica,
//     ties by id. Every rank computes the same assignment with no messages, no
//     coordinator to wait on, and a makespan within 4/3 of optimal for these
//     independent jobs.
//  5. Staged (jobs/staged_phases.h): the pipeline first holds only its text
//     encoders; each round of schedule.stage_requests requests has its
//     distinct texts encoded once into the output folder's embedding cache,
//     then the encoders are freed (their memory returned) and the
//     transformer and VAE run the round's units with the embeddings given.
//     Each replica runs its requests in order; all TP ranks of a replica run
//     the same request. A RequestError (bad size, prompt, NaN latents) is
//     recorded `failed` and the batch goes on. The replica's TP rank 0 writes
//     images/<id>.png (atomically, never over a file tprun did not write:
//     output_folder.h place_output_file) and sends its record to world rank 0,
//     the one writer of results.jsonl (appended and flushed per request).
//  6. SIGTERM / SIGINT: each replica agrees (an AllReduce of the flag over its
//     TP group before each request and at every denoise step) to stop; the
//     request it was on is dropped (nothing of it written; it runs again on
//     resume), the results are flushed and the process exits with
//     kInterrupted (75), which requeue scripts recognise. With --status-file,
//     rank 0 writes 75 there as soon as it sees the signal (run_status.h), so
//     a launcher that kills after its grace time still leaves the verdict. A rank that dies ends the job through the
//     launcher (and the collective watchdog); what was written stays intact.

#include <string>
#include <vector>

#include "jobs/manifest.h"

namespace tprun {
class Session;
}

namespace tprun::jobs {

// Exit codes of `tprun run` beyond runtime/error.h's.
constexpr int kExitSomeFailed = 6;    // the batch finished; some requests are `failed` (= kRequest)
constexpr int kExitInterrupted = 75;  // stopped by SIGTERM/SIGINT; rerun to resume (EX_TEMPFAIL)

struct RunOptions {
  std::string manifest;
  std::vector<Override> overrides;  // --set, --out
  bool retry_failed = false;
  std::string progress = "auto";  // auto | live | log | none
  // Chunk `shard_index` of `shard_count` (0: the whole file): the requests at
  // positions p (file order) with p % count == index, written to
  // <output.dir>/shard-<index>-of-<count>, resumable on its own; merge the
  // chunks with `tprun merge-results`. A Slurm job array passes
  // --shard slurm (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN of SLURM_ARRAY_TASK_COUNT).
  int shard_index = 0, shard_count = 0;
  // Rank 0 writes {"exit_code": N, "state": ...} here (atomically) when the
  // run ends with an exit code every rank shares, so a requeue script reads
  // tprun's verdict instead of the launcher's exit status ("" = none).
  std::string status_file;
};

// Parses "I/N" (0 <= I < N) or "slurm" (from the job array's variables).
// ConfigError naming --shard.
void parse_shard(const std::string& text, RunOptions& options);

// Runs the job; writes options.status_file (rank 0) with the exit code.
int run_job(Session& session, const RunOptions& options);

// Installs the SIGTERM/SIGINT handlers that set the stop flag.
void install_stop_handlers();
bool stop_requested();

}  // namespace tprun::jobs
