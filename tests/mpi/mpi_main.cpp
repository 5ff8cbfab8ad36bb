// GoogleTest under mpirun: MPI is initialised once for all cases; only rank 0
// prints the full report, other ranks print their failures.
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "runtime/logging.h"

namespace {

class FailureOnlyPrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailureOnlyPrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  tprun::init_logging({rank, world, "warn", ""});
  // A hung collective in a test ends the run instead of the ctest timeout.
  auto* dog = new tprun::dist::CommWatchdog(std::chrono::milliseconds(120000));
  tprun::dist::CommWatchdog::set_global(dog);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailureOnlyPrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  delete dog;
  MPI_Finalize();
  return worst;
}
