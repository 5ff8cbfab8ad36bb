#pragma once
// The process-wide context of one tprun rank: MPI, who this rank is, logging,
// device, CPU threads and the communication watchdog. Commands start one
// Session; it finalizes MPI when it ends.

#include <memory>
#include <string>
#include <vector>

#include "dist/device_mesh.h"
#include "runtime/device.h"
#include "runtime/rank_env.h"

namespace tprun {

namespace dist {
class CommWatchdog;
}  // namespace dist

struct SessionOptions {
  std::string device;          // "" automatic, "cpu", "cuda", "cuda:N"
  int threads = 0;             // 0: split this node's CPUs between its ranks
  std::string log_level;       // "" = SPDLOG_LEVEL or info
  std::string log_dir = "logs";
  double comm_timeout_s = 1800;  // <= 0: no deadline
  dist::CommChoice comm = dist::CommChoice::Auto;  // TP backend for CUDA tensors (--comm)
};

class Session {
 public:
  // MPI_Init, rank environment, logging, device and threads. Collective.
  Session(int* argc, char*** argv, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  static Session* current();

  const RankEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world() const { return env_.world; }
  const std::string& host() const { return host_; }
  const DeviceChoice& device() const { return device_; }
  int threads() const { return threads_; }
  const std::string& cpus() const { return cpus_; }
  dist::CommWatchdog* watchdog() const { return watchdog_.get(); }
  dist::CommChoice comm() const { return comm_; }
  // The TP group's backend for this rank's device: "mpi", "nccl" or "mpi-staged".
  const char* tp_backend() const;

  // Collective: builds the mesh for this session's device.
  std::unique_ptr<dist::DeviceMesh> make_mesh(const dist::MeshSpec& spec) const;

 private:
  RankEnv env_;
  std::string host_;
  DeviceChoice device_;
  int threads_ = 1;
  std::string cpus_;
  dist::CommChoice comm_ = dist::CommChoice::Auto;
  std::unique_ptr<dist::CommWatchdog> watchdog_;
};

}  // namespace tprun
