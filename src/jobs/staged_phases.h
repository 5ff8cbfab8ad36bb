#pragma once
// The encode phase of a staged job ([schedule] phases = "staged", docs/jobs.md
// "Staged phases"): a round of a replica's units has its distinct texts
// encoded once on a pipeline loaded with only its text encoders, the
// embeddings kept on disk (jobs/embedding_cache.h) so a rerun after a crash
// reuses them; then the encoders are freed and the transformer and VAE
// denoise each request with its embeddings given as tensors, which makes the
// same bytes as encoding in process ("together").

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jobs/embedding_cache.h"
#include "jobs/job_schedule.h"
#include "jobs/manifest.h"
#include "pipelines/pipeline.h"

namespace tprun::dist {
class DeviceMesh;
}

namespace tprun::jobs {

// What one round's encode phase did on this rank.
struct EncodeRound {
  int64_t encoded = 0;  // distinct texts encoded now
  double seconds = 0;
  bool stopped = false;  // the TP group agreed to stop (SIGTERM); what was encoded is kept
  // Requests whose text could not be encoded (RequestError: bad UTF-8, ...):
  // id -> the error; they are recorded `failed` without denoising.
  std::map<std::string, std::string> failed;
};

// The units split into rounds of at most `stage_requests` requests (a unit is
// never split; 0 = one round of everything).
std::vector<std::vector<Unit>> stage_rounds(const std::vector<Unit>& units, int64_t stage_requests);

// The settings besides the model's files that the embeddings depend on, for
// embedding_fingerprint: dtype, the TP size and sharding of the encoders,
// their memory options.
std::string embedding_settings(const Manifest& manifest, int tp_size);

// One distinct text a round needs and the requests that need it.
struct PendingText {
  pipelines::TextEncode encode;
  std::vector<const JobRequest*> users;
};

// The texts the requests of `round` need (pipeline.text_encodes: any load of
// the pipeline answers it) that `cache` lacks, each once, in the order of
// first use: the same on every rank of a TP group (the same requests, the
// same cache index). `reused` counts the distinct texts the cache holds.
std::vector<PendingText> pending_texts(const pipelines::Pipeline& pipeline, const std::vector<Unit>& round,
                                       const EmbeddingCache& cache, int64_t& reused);

// Encodes `pending` on `encoders` (a pipeline loaded with denoiser = false),
// every rank of the TP group alike (sharded encoders are collective); TP
// rank 0 writes them as one chunk file (named by `replica` and the keys'
// hash) and the group agrees on the outcome before every rank indexes it.
// `agree_stop` (collective over the TP group) is asked before each encode;
// what was encoded before a stop is written. An I/O error writing the chunk
// ends the job on every rank of the group.
EncodeRound encode_texts(const pipelines::Pipeline& encoders, const std::vector<PendingText>& pending, int replica,
                         EmbeddingCache& cache, dist::DeviceMesh& mesh, const std::function<bool()>& agree_stop);

// `request` with the embeddings of its encodes (pipeline.text_encodes) taken
// from `cache` into its given tensors (those it gave itself kept).
pipelines::GenerationRequest with_embeddings(const pipelines::Pipeline& pipeline,
                                             const pipelines::GenerationRequest& request,
                                             const EmbeddingCache& cache);

}  // namespace tprun::jobs
