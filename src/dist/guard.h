#pragma once
// The process boundary. Every tprun entry point runs its body through
// run_guarded, which turns an escaping exception into one log line with the
// rank and an exit code, and makes sure no peer is left waiting:
//   * tprun::Error marked all_ranks (every rank raised it identically): each
//     rank logs it, MPI is finalized, the process exits with the error's code;
//   * anything else on a multi-rank job: log, flush, MPI_Abort, so mpirun or
//     srun ends every rank within seconds.

#include <functional>

namespace tprun {

int run_guarded(const std::function<int()>& body) noexcept;

}  // namespace tprun
