#pragma once
// CPU threads under an address-space limit (`ulimit -v`, RLIMIT_AS).
//
// Every thread reserves its stack (the default thread stack size: RLIMIT_STACK, 8 MiB as a rule)
// and glibc gives each thread that allocates a malloc arena that reserves 64 MiB more. Under a
// tight RLIMIT_AS, pthread_create then fails, and libtorch's pthreadpool (created by
// at::set_num_threads) ignores that failure and waits forever for the thread it did not get. So the
// limit is checked before the thread pools are sized: the threads are lowered, with a warning, to
// what fits, and the malloc arenas are capped.

#include <cstdint>
#include <optional>
#include <string>

namespace tprun {

struct ThreadBudget {
  int threads = 1;                     // intra-op threads to use (at least 1)
  std::optional<std::string> warning;  // set when fewer than wanted
  std::optional<uint64_t> limit;       // RLIMIT_AS (none: unlimited)
  uint64_t used = 0;                   // address space in use when checked
  uint64_t per_thread = 0;             // address space one thread reserves
};

// Threads the pools start for `intra` intra-op threads: libtorch's pthreadpool and OpenMP's team
// (intra - 1 each: the caller is the first), the inter-op pool (intra / 2) and a few of tprun's and
// MPI's own (watchdog, progress threads).
uint64_t pool_threads_for(int intra);

// The most intra-op threads (at most `wanted`, at least 1) whose pools fit in half of the
// address space left (`limit` - `used`), at `per_thread` bytes each; the other half is the work's.
// No limit: `wanted`.
ThreadBudget fit_threads(int wanted, std::optional<uint64_t> limit, uint64_t used, uint64_t per_thread);

// The address space one new thread reserves: the default thread stack size plus its guard page.
uint64_t thread_stack_bytes();

// fit_threads for this process (RLIMIT_AS, VmSize, thread_stack_bytes()).
ThreadBudget fit_threads_to_address_space(int wanted);

// Under a finite RLIMIT_AS, caps glibc's malloc arenas (M_ARENA_MAX) so that threads do not each
// reserve 64 MiB of the limit. Call early, before threads start. Returns whether it did.
bool cap_malloc_arenas_under_address_limit();

}  // namespace tprun
