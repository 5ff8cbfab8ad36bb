#pragma once
// The job's control messages between ranks, behind one small class so that no
// raw MPI call lives above dist/ (c10d sends everything through a process
// group): agreement on a verdict, broadcasts of small values, and the record
// channel that carries each replica's result records to world rank 0.
//
// Contract: agree / broadcast / barrier are collective over the world, in the
// same order on every rank, and run under the communication watchdog (a
// peer that never arrives ends the job with a message, never a hang).
// send_to_root never blocks; rank 0 drains with poll() between requests and
// wait() at the end. wait() and flush() are not under the deadline: other
// replicas (rank 0's own included) may legitimately compute for hours before
// the messages are taken, and a replica that dies ends the job through the
// launcher.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

namespace tprun::dist {

class CommWatchdog;

class ControlPlane {
 public:
  enum class Tag : int { Record = 11, Finish = 12 };
  using Handler = std::function<void(Tag tag, int source, const std::string& payload)>;

  // Collective over MPI_COMM_WORLD: its own duplicate of the world
  // communicator, so control messages never match anything else.
  explicit ControlPlane(CommWatchdog* watchdog);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Runs `fn` on rank 0; a tprun::Error it raises is raised on every rank
  // alike (same kind and message, marked as raised on all ranks), so all
  // ranks stop with one message.
  void agree(const std::function<void()>& fn);
  // Rank 0's value to every rank.
  void broadcast(std::string& value);
  void broadcast(int64_t& value);
  void barrier();

  // Queues `payload` for world rank 0 (non-blocking; kept until sent). For
  // the other ranks: rank 0 handles its own records directly (a message it
  // queued for itself would reach its own next poll/wait).
  void send_to_root(Tag tag, std::string payload);
  // Rank 0: handles every message that has arrived; returns how many.
  int poll(const Handler& handle);
  // Rank 0: waits for the next message and handles it.
  void wait(const Handler& handle);
  // Waits until every message this rank queued has been delivered.
  void flush();

 private:
  struct Pending;
  void receive(int source, int tag, int bytes, const Handler& handle);
  CommWatchdog* watchdog_;
  int rank_ = 0, size_ = 1;
  struct Comm;
  std::unique_ptr<Comm> comm_;
  std::deque<std::unique_ptr<Pending>> pending_;
};

}  // namespace tprun::dist
