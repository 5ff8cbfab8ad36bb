#pragma once
// A request that runs out of memory fails as that request, not as the job.
// libtorch reports a failed allocation as c10::OutOfMemoryError (CUDA's
// caching allocator: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0
// has a total capacity of ...") or as a plain c10::Error from its CPU
// allocator ("DefaultCPUAllocator: can't allocate memory: you tried to
// allocate N bytes. Error code 12 ..."; torch 2.11); the C++ runtime as
// std::bad_alloc. Here such an exception becomes a RequestError naming the
// request, the device, the memory asked for and what is free there now.

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/error.h"

namespace tprun {

// Only this much of an exception's message is read (a hostile or huge what()
// costs nothing).
constexpr size_t kOutOfMemoryMessageScan = 4096;

// The bytes an allocator's message says it was asked for: "you tried to
// allocate 4503599627370496 bytes" (CPU) or "Tried to allocate 2.00 GiB"
// (CUDA; units bytes/B/KiB/MiB/GiB/TiB), looked for in the first
// kOutOfMemoryMessageScan characters. nullopt when absent, unreadable or
// beyond 2^64 - 1 bytes ("Tried to allocate more than 1EB memory").
std::optional<uint64_t> parse_requested_bytes(std::string_view message);

// True for an exception that reports a failed allocation:
// c10::OutOfMemoryError, std::bad_alloc, a c10::Error from a libtorch
// allocator ("can't allocate memory", "not enough memory", "out of memory"),
// a DeviceError for cudaErrorMemoryAllocation, or a tprun::Error that carries
// one of these as its std::nested_exception (how the pipelines' own
// conversion passes the original on). False for a null pointer.
bool is_out_of_memory(const std::exception_ptr& error);

// For a catch block around a request's compute (`error`:
// std::current_exception()). An out-of-memory error gives the freed memory
// back (release_free_memory: libtorch's CUDA caches, the heap), then returns
//   "<request> ran out of memory while generating (asked for 2 GiB on cuda:0,
//    which has 1.10 GiB free of 139.72 GiB now; <the allocator's line>); try ..."
// with the hint (a smaller height/width or batch_size, a larger tp, [memory]
// vae_tiling, attention_chunk, offload or fp8 storage, `tprun plan`). `request` names it ("request 'a'");
// `device` is where it ran ("cpu" or "cuda:N"; for cpu the host's tightest
// limit is named). Not marked all_ranks (only this rank is known to have
// failed): the caller decides whether its group can go on (tp 1: the request
// fails, the batch goes on) or must end the job. Anything else is rethrown
// unchanged.
RequestError out_of_memory_error(const std::exception_ptr& error, const std::string& request,
                                 const std::string& device);

}  // namespace tprun
