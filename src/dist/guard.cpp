#include "dist/guard.h"

#include <exception>

#include <spdlog/spdlog.h>

#include "dist/mpi_world.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace tprun {
namespace {

int world_size() {
  if (!dist::mpi_is_initialized() || dist::mpi_is_finalized()) return 1;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}

int fail(const char* kind, const std::string& message, int code, bool all_ranks) {
  try {
    spdlog::error("{}: {}", kind, message);
  } catch (...) {
  }
  flush_logs();
  if (all_ranks || world_size() == 1) {
    dist::mpi_finalize();
    return code;
  }
  dist::abort_job(code);
}

}  // namespace

int run_guarded(const std::function<int()>& body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    return fail(e.kind_name(), e.what(), e.exit_code(), e.all_ranks());
  } catch (const std::bad_alloc&) {
    return fail("internal error", "out of memory", exit_code::kInternal, false);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), exit_code::kInternal, false);
  } catch (...) {
    return fail("internal error", "unknown exception", exit_code::kInternal, false);
  }
}

}  // namespace tprun
