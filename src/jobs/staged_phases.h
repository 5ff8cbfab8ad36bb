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
class ControlPlane;
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
// embedding_fingerprint: tprun's version (the encoding code, templates),
// dtype, the device the encoders run on ("cpu", "cuda:0": its kind counts),
// the TP size and sharding of the encoders, their memory options.
std::string embedding_settings(const Manifest& manifest, int tp_size, const std::string& device);

// What a cached entry must be for `pipeline` and `requests` (the runnable
// ones): floating-point tensors in the manifest's dtype; for a key one of
// the requests needs (pipeline.text_encodes), every tensor its `gives` names,
// floating point, accepted by pipeline.check_request as the request's given
// tensors (shape, width, at least one text token). check_entry refers to
// `pipeline`: use the rules while it lives.
ChunkRules chunk_rules(const Manifest& manifest, const pipelines::Pipeline& pipeline,
                       const std::vector<const JobRequest*>& requests);

// The job's embedding cache, the same on every rank: world rank 0 sweeps it
// (EmbeddingCache::sweep: every chunk read whole and checked against
// chunk_rules, each unusable one moved aside with a warning) and every rank
// indexes the chunks it kept. Collective over the world (`control`).
// ConfigError on every rank for embeddings/ or its fingerprint folder as a
// symlink or not a folder.
std::unique_ptr<EmbeddingCache> open_embedding_cache(const std::string& output_dir, const Manifest& manifest,
                                                     int tp_size, const std::string& device,
                                                     const pipelines::Pipeline& pipeline,
                                                     const std::vector<const JobRequest*>& requests,
                                                     dist::ControlPlane& control);

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
// hash; "-<n>" added when a file of that name is there) and the group agrees
// on the outcome and the name before every rank indexes it.
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
