#include "dist/mpi_world.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/logging.h"

namespace tprun::dist {

void mpi_init(int* argc, char*** argv) {
  if (mpi_is_initialized()) return;
  int provided = 0;
  // FUNNELED: only the main thread calls MPI; the watchdog thread only ever
  // calls MPI_Abort, which Open MPI allows from any thread.
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

bool mpi_is_initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool mpi_is_finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

void mpi_finalize() noexcept {
  if (mpi_is_initialized() && !mpi_is_finalized()) MPI_Finalize();
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(fmt::format("{} failed: {}", what, std::string(text, static_cast<size_t>(len))));
}

MpiIdentity mpi_identity() {
  MpiIdentity id;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &id.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &id.world), "MPI_Comm_size");
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, id.rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  MPI_Comm_rank(local, &id.local_rank);
  MPI_Comm_size(local, &id.local_size);
  MPI_Comm_free(&local);
  return id;
}

std::vector<int> mpi_node_of_rank() {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  // The node's leader is its lowest world rank; every member learns it.
  int leader = rank;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, local), "MPI_Allreduce(node leader)");
  MPI_Comm_free(&local);
  std::vector<int> leaders(static_cast<size_t>(world));
  check_mpi(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD),
            "MPI_Allgather(node leaders)");
  std::vector<int> sorted = leaders;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<int> node(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    node[static_cast<size_t>(r)] = static_cast<int>(
        std::lower_bound(sorted.begin(), sorted.end(), leaders[static_cast<size_t>(r)]) -
        sorted.begin());
  }
  return node;
}

std::vector<std::string> mpi_all_gather_strings(MPI_Comm comm, const std::string& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (mine.size() > static_cast<size_t>(INT_MAX)) throw CommError("string too long to gather");
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size));
  check_mpi(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather(lengths)");
  std::vector<int> displs(static_cast<size_t>(size));
  long total = 0;
  for (int i = 0; i < size; ++i) {
    displs[static_cast<size_t>(i)] = static_cast<int>(total);
    total += lens[static_cast<size_t>(i)];
  }
  if (total > INT_MAX) throw CommError("strings too long to gather");
  std::string all(static_cast<size_t>(total), '\0');
  check_mpi(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                           MPI_CHAR, comm),
            "MPI_Allgatherv(strings)");
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i)
    out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(i)]),
                             static_cast<size_t>(lens[static_cast<size_t>(i)])));
  return out;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

void abort_job(int exit_code) noexcept {
  flush_logs();
  if (mpi_is_initialized() && !mpi_is_finalized()) {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace tprun::dist
