// The encode phase of a staged job: rounds, distinct texts, the chunk file
// written by TP rank 0 and agreed on by its group. See staged_phases.h.
#include "jobs/staged_phases.h"

#include <chrono>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "dist/communicator.h"
#include "dist/device_mesh.h"
#include "memory/memory_options.h"
#include "runtime/error.h"

namespace tprun::jobs {

namespace {

using Clock = std::chrono::steady_clock;

// "r<replica>-<hash of the keys>.safetensors": the same keys make the same name.
std::string chunk_name(int replica, const std::vector<std::pair<std::string, models::TensorMap>>& entries) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (const auto& [key, value] : entries) {
    XXH64_update(state, key.data(), key.size());
    XXH64_update(state, "\0", 1);
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return fmt::format("r{}-{:016x}.safetensors", replica, h);
}

// TP rank 0 writes the chunk; the group agrees on the outcome (a failed write
// ends the job on every rank of the group, naming the file on the writer);
// then every rank indexes it.
void write_agreed(const std::vector<std::pair<std::string, models::TensorMap>>& entries, int replica,
                  EmbeddingCache& cache, dist::DeviceMesh& mesh) {
  const std::string name = chunk_name(replica, entries);
  std::string error;
  if (mesh.tp_rank() == 0) {
    try {
      cache.write_chunk(name, entries);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt));
  if (mesh.tp_size() > 1) mesh.tp().all_reduce(failed, {dist::ReduceOp::Max});
  if (failed.item<int>() != 0) {
    if (!error.empty()) throw IoError(fmt::format("cannot write the embedding cache {}/{}: {}", cache.folder(), name, error));
    throw IoError(fmt::format("the embedding cache {}/{} could not be written by TP rank 0 of replica {} (its log "
                              "names the cause)",
                              cache.folder(), name, replica));
  }
  if (mesh.tp_rank() != 0) cache.index_chunk(name);
}

}  // namespace

std::vector<std::vector<Unit>> stage_rounds(const std::vector<Unit>& units, int64_t stage_requests) {
  std::vector<std::vector<Unit>> rounds;
  int64_t in_round = 0;
  for (const Unit& unit : units) {
    const auto n = static_cast<int64_t>(unit.size());
    if (rounds.empty() || (stage_requests > 0 && in_round + n > stage_requests && in_round > 0)) {
      rounds.emplace_back();
      in_round = 0;
    }
    rounds.back().push_back(unit);
    in_round += n;
  }
  return rounds;
}

std::string embedding_settings(const Manifest& m, int tp_size) {
  return fmt::format("dtype={}\ntp={}\nshard_text_encoders={}\nmemory={}", m.dtype, tp_size,
                     m.shard_text_encoders ? (*m.shard_text_encoders ? "true" : "false") : "default",
                     memory::describe(m.memory));
}

std::vector<PendingText> pending_texts(const pipelines::Pipeline& pipeline, const std::vector<Unit>& round,
                                       const EmbeddingCache& cache, int64_t& reused) {
  std::vector<PendingText> pending;
  std::map<std::string, size_t> index;
  std::set<std::string> cached;
  for (const Unit& unit : round) {
    for (const JobRequest* r : unit) {
      for (const auto& e : pipeline.text_encodes(r->gen)) {
        if (cache.contains(e.key)) {
          if (cached.insert(e.key).second) ++reused;
          continue;
        }
        const auto [it, fresh] = index.emplace(e.key, pending.size());
        if (fresh) pending.push_back({e, {}});
        pending[it->second].users.push_back(r);
      }
    }
  }
  return pending;
}

EncodeRound encode_texts(const pipelines::Pipeline& encoders, const std::vector<PendingText>& pending, int replica,
                         EmbeddingCache& cache, dist::DeviceMesh& mesh, const std::function<bool()>& agree_stop) {
  const auto t0 = Clock::now();
  EncodeRound out;
  std::vector<std::pair<std::string, models::TensorMap>> done;
  for (const PendingText& p : pending) {
    if (agree_stop()) {
      out.stopped = true;
      break;
    }
    try {
      models::TensorMap e = encoders.encode_text(p.encode);
      for (const JobRequest* u : p.users) encoders.warn_truncation(u->gen, p.encode, e);
      done.emplace_back(p.encode.key, std::move(e));
      ++out.encoded;
    } catch (const RequestError& err) {
      for (const JobRequest* u : p.users) out.failed[u->id] = err.what();
    }
  }
  if (!done.empty()) write_agreed(done, replica, cache, mesh);
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

pipelines::GenerationRequest with_embeddings(const pipelines::Pipeline& pipeline,
                                             const pipelines::GenerationRequest& request,
                                             const EmbeddingCache& cache) {
  const std::vector<pipelines::TextEncode> encodes = pipeline.text_encodes(request);
  if (encodes.empty()) return request;
  auto given = std::make_shared<models::TensorMap>(request.given ? *request.given : models::TensorMap{});
  for (const auto& e : encodes) {
    const models::TensorMap stored = cache.get(e.key);
    for (const auto& [from, to] : e.gives) {
      auto it = stored.find(from);
      if (it == stored.end()) {
        throw CheckpointError(fmt::format("the embedding cache {} holds no '{}' for the {} of request {}",
                                          cache.folder(), from, e.field, request.id));
      }
      (*given)[to] = it->second;
    }
  }
  pipelines::GenerationRequest out = request;
  out.given = std::move(given);
  return out;
}

}  // namespace tprun::jobs
