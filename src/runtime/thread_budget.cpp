#include "runtime/thread_budget.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "runtime/host_memory.h"

namespace tprun {
namespace {

constexpr uint64_t kMiscThreads = 4;  // watchdog, MPI progress, and the like
constexpr int kArenasUnderLimit = 2;

std::optional<uint64_t> address_space_limit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<uint64_t>(rl.rlim_cur);
}

}  // namespace

uint64_t pool_threads_for(int intra) {
  const uint64_t t = static_cast<uint64_t>(std::max(1, intra));
  return 2 * (t - 1) + std::max<uint64_t>(1, t / 2) + kMiscThreads;
}

ThreadBudget fit_threads(int wanted, std::optional<uint64_t> limit, uint64_t used, uint64_t per_thread) {
  ThreadBudget b;
  b.threads = std::max(1, wanted);
  b.limit = limit;
  b.used = used;
  b.per_thread = per_thread;
  if (!limit) return b;
  const uint64_t left = *limit > used ? *limit - used : 0;
  const uint64_t for_threads = left / 2;
  per_thread = std::max<uint64_t>(per_thread, 1);
  int fit = b.threads;
  while (fit > 1 && pool_threads_for(fit) * per_thread > for_threads) --fit;
  if (fit < b.threads) {
    b.warning = fmt::format(
        "address-space limit {} (ulimit -v; {} left, {} per thread stack): using {} thread(s) instead of {}; raise "
        "the limit or pass --threads {} to silence this",
        format_bytes(*limit), format_bytes(left), format_bytes(per_thread), fit, b.threads, fit);
    b.threads = fit;
  }
  return b;
}

uint64_t thread_stack_bytes() {
  size_t stack = 0;
  pthread_attr_t attr;
  if (pthread_getattr_default_np(&attr) == 0) {
    pthread_attr_getstacksize(&attr, &stack);
    pthread_attr_destroy(&attr);
  }
  if (stack == 0) stack = 8u << 20;
  return static_cast<uint64_t>(stack) + static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

ThreadBudget fit_threads_to_address_space(int wanted) {
  return fit_threads(wanted, address_space_limit(), self_status_bytes("VmSize"), thread_stack_bytes());
}

bool cap_malloc_arenas_under_address_limit() {
  if (!address_space_limit()) return false;
  return mallopt(M_ARENA_MAX, kArenasUnderLimit) == 1;
}

}  // namespace tprun
