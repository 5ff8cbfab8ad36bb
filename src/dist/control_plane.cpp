#include "dist/control_plane.h"

#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/mpi_world.h"
#include "runtime/error.h"

namespace tprun::dist {

struct ControlPlane::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
};

struct ControlPlane::Pending {
  std::string payload;
  MPI_Request request = MPI_REQUEST_NULL;
};

namespace {
constexpr const char* kGroup = "control";
}

ControlPlane::ControlPlane(CommWatchdog* watchdog) : watchdog_(watchdog), comm_(std::make_unique<Comm>()) {
  CommWatchdog::Armed armed(watchdog_, "creating the control plane", kGroup);
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_->comm), "MPI_Comm_dup (control plane)");
  MPI_Comm_rank(comm_->comm, &rank_);
  MPI_Comm_size(comm_->comm, &size_);
}

ControlPlane::~ControlPlane() {
  for (auto& p : pending_) {
    if (p->request != MPI_REQUEST_NULL) MPI_Wait(&p->request, MPI_STATUS_IGNORE);
  }
  if (comm_->comm != MPI_COMM_NULL && !mpi_is_finalized()) MPI_Comm_free(&comm_->comm);
}

void ControlPlane::broadcast(std::string& s) {
  CommWatchdog::Armed armed(watchdog_, "broadcast", kGroup);
  uint64_t n = s.size();
  check_mpi(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm_->comm), "MPI_Bcast (control plane)");
  s.resize(n);
  // Large values in chunks that fit an int count.
  constexpr uint64_t kChunk = uint64_t{1} << 30;
  for (uint64_t off = 0; off < n; off += kChunk) {
    const int len = static_cast<int>(std::min(kChunk, n - off));
    check_mpi(MPI_Bcast(s.data() + off, len, MPI_CHAR, 0, comm_->comm), "MPI_Bcast (control plane)");
  }
}

void ControlPlane::broadcast(int64_t& v) {
  CommWatchdog::Armed armed(watchdog_, "broadcast", kGroup);
  check_mpi(MPI_Bcast(&v, 1, MPI_INT64_T, 0, comm_->comm), "MPI_Bcast (control plane)");
}

void ControlPlane::barrier() {
  CommWatchdog::Armed armed(watchdog_, "barrier", kGroup);
  check_mpi(MPI_Barrier(comm_->comm), "MPI_Barrier (control plane)");
}

void ControlPlane::agree(const std::function<void()>& fn) {
  int64_t kind = -1;
  std::string message;
  if (rank_ == 0) {
    try {
      fn();
    } catch (const Error& e) {
      kind = static_cast<int64_t>(e.kind());
      message = e.what();
    }
  }
  broadcast(kind);
  broadcast(message);
  if (kind >= 0) throw Error(static_cast<Error::Kind>(kind), message, true);
}

void ControlPlane::send_to_root(Tag tag, std::string payload) {
  auto p = std::make_unique<Pending>();
  p->payload = std::move(payload);
  if (p->payload.size() > static_cast<size_t>(INT32_MAX)) {
    throw Error(Error::Kind::Internal, "control plane: a message beyond 2 GB");
  }
  check_mpi(MPI_Isend(p->payload.data(), static_cast<int>(p->payload.size()), MPI_CHAR, 0, static_cast<int>(tag),
                      comm_->comm, &p->request),
            "MPI_Isend (control plane)");
  pending_.push_back(std::move(p));
  // Forget what has been delivered already.
  while (!pending_.empty()) {
    int done = 0;
    MPI_Test(&pending_.front()->request, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    pending_.pop_front();
  }
}

void ControlPlane::receive(int source, int tag, int bytes, const Handler& handle) {
  std::string buf(static_cast<size_t>(bytes), '\0');
  check_mpi(MPI_Recv(buf.data(), bytes, MPI_CHAR, source, tag, comm_->comm, MPI_STATUS_IGNORE),
            "MPI_Recv (control plane)");
  handle(static_cast<Tag>(tag), source, buf);
}

int ControlPlane::poll(const Handler& handle) {
  int handled = 0;
  while (true) {
    int flag = 0;
    MPI_Status st;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_->comm, &flag, &st), "MPI_Iprobe (control plane)");
    if (!flag) return handled;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    receive(st.MPI_SOURCE, st.MPI_TAG, n, handle);
    ++handled;
  }
}

void ControlPlane::wait(const Handler& handle) {
  MPI_Status st;
  check_mpi(MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_->comm, &st), "MPI_Probe (control plane)");
  int n = 0;
  MPI_Get_count(&st, MPI_CHAR, &n);
  receive(st.MPI_SOURCE, st.MPI_TAG, n, handle);
}

void ControlPlane::flush() {
  // Not under the deadline: rank 0 takes messages between its own requests.
  for (auto& p : pending_) {
    if (p->request != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&p->request, MPI_STATUS_IGNORE), "MPI_Wait (control plane)");
  }
  pending_.clear();
}

}  // namespace tprun::dist
