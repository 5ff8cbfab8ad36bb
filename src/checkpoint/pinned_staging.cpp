#include "checkpoint/pinned_staging.h"

#include <algorithm>
#include <exception>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"

namespace tprun::checkpoint {
namespace {

[[noreturn]] void throw_kind(Error::Kind kind, const std::string& message, bool all_ranks) {
  switch (kind) {
    case Error::Kind::Config: throw ConfigError(message, all_ranks);
    case Error::Kind::Checkpoint: throw CheckpointError(message, all_ranks);
    case Error::Kind::Comm: throw CommError(message, all_ranks);
    case Error::Kind::Request: throw RequestError(message, all_ranks);
    case Error::Kind::Io: throw IoError(message, all_ranks);
    case Error::Kind::Device: throw DeviceError(message, all_ranks);
    case Error::Kind::Internal: break;
  }
  throw Error(Error::Kind::Internal, message, all_ranks);
}

// The exception being handled, again, its message prefixed with the tensor
// and the step so a failure deep in a load says which weight it was; a
// tprun::Error keeps its kind, anything else becomes `fallback`.
[[noreturn]] void rethrow_named(const std::string& name, const char* step, Error::Kind fallback) {
  const std::string prefix = fmt::format("tensor '{}': {}: ", name, step);
  try {
    throw;
  } catch (const Error& e) {
    throw_kind(e.kind(), prefix + e.what(), e.all_ranks());
  } catch (const std::exception& e) {
    throw_kind(fallback, prefix + e.what(), false);
  } catch (...) {
    throw_kind(fallback, prefix + "unknown error", false);
  }
}

constexpr const char* kCopyStep = "copy to the device";

}  // namespace

StagingPipeline::StagingPipeline(std::unique_ptr<CopyEngine> engine, int buffers) : engine_(std::move(engine)) {
  if (!engine_) throw Error(Error::Kind::Internal, "StagingPipeline: no copy engine");
  if (buffers < 1) throw Error(Error::Kind::Internal, fmt::format("StagingPipeline: {} buffers (need >= 1)", buffers));
  slots_.resize(static_cast<size_t>(buffers));
}

StagingPipeline::~StagingPipeline() {
  drain(/*first_failure_is_news=*/true);
  release_buffers();
}

void StagingPipeline::wait_slot(Slot& slot) {
  if (slot.ticket == 0) return;
  const CopyEngine::Ticket t = slot.ticket;
  slot.ticket = 0;  // wait_host retires the ticket even when it throws
  try {
    engine_->wait_host(t);
  } catch (...) {
    rethrow_named(slot.name, kCopyStep, Error::Kind::Device);
  }
}

void StagingPipeline::drain(bool first_failure_is_news) noexcept {
  for (Slot& slot : slots_) {
    if (slot.ticket == 0) continue;
    const CopyEngine::Ticket t = slot.ticket;
    slot.ticket = 0;
    try {
      engine_->wait_host(t);
    } catch (const std::exception& e) {
      // In the destructor nobody else reports it; on an error path it is a
      // second failure while the first is being reported.
      if (first_failure_is_news) {
        spdlog::warn("staging: copy of tensor '{}' to the device failed: {}", slot.name, e.what());
      } else {
        spdlog::debug("staging: copy of tensor '{}' also failed: {}", slot.name, e.what());
      }
    } catch (...) {
      spdlog::warn("staging: copy of tensor '{}' to the device failed", slot.name);
    }
  }
}

void StagingPipeline::release_buffers() noexcept {
  for (Slot& slot : slots_) {
    if (slot.host != nullptr) engine_->free_host(slot.host, slot.size);
    live_bytes_ -= slot.size;
    slot.host = nullptr;
    slot.size = 0;
  }
}

void StagingPipeline::upload(const std::string& name, void* device_dst, size_t bytes, const ReadFn& read) {
  if (bytes == 0) {
    ++stats_.slices;
    return;
  }
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  // Every failure below drains the other buffers' copies before it leaves:
  // the caller frees the destinations on the way out.
  try {
    wait_slot(slot);
  } catch (...) {
    drain();
    throw;
  }
  if (slot.size < bytes) {
    // Grown, never kept side by side with its smaller predecessor.
    if (slot.host != nullptr) engine_->free_host(slot.host, slot.size);
    live_bytes_ -= slot.size;
    slot.host = nullptr;
    slot.size = 0;
    try {
      slot.host = engine_->allocate_host(bytes);
    } catch (...) {
      drain();
      rethrow_named(name, "allocating a staging buffer", Error::Kind::Device);
    }
    slot.size = bytes;
    live_bytes_ += bytes;
    ++stats_.buffers_allocated;
    stats_.peak_staging_bytes = std::max(stats_.peak_staging_bytes, live_bytes_);
  }
  try {
    read(slot.host);
  } catch (...) {
    drain();
    rethrow_named(name, "reading into the staging buffer", Error::Kind::Checkpoint);
  }
  CopyEngine::Ticket ticket = 0;
  try {
    ticket = engine_->copy_async(device_dst, slot.host, bytes);
  } catch (...) {
    drain();
    rethrow_named(name, kCopyStep, Error::Kind::Device);
  }
  slot.ticket = ticket;
  slot.name = name;
  try {
    engine_->wait_compute(ticket);
  } catch (...) {
    drain();
    rethrow_named(name, kCopyStep, Error::Kind::Device);
  }
  ++stats_.slices;
  stats_.bytes += bytes;
}

void StagingPipeline::finish() {
  std::exception_ptr first;
  for (Slot& slot : slots_) {
    try {
      wait_slot(slot);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace tprun::checkpoint
