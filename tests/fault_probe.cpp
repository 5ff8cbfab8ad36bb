// A tiny tprun-like program for the failure tests: one rank misbehaves while
// the others wait in a collective; the job must end, not hang.
//   tprun_fault_probe throw  <bad_rank>   the bad rank throws an internal error
//   tprun_fault_probe signal <bad_rank>   the bad rank is killed by SIGKILL
//   tprun_fault_probe hang   <bad_rank>   the bad rank never joins (watchdog)
//   tprun_fault_probe ok     <any>        everyone completes
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <ATen/ops/ones.h>

#include "dist/device_mesh.h"
#include "dist/guard.h"
#include "dist/session.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[1];
  const int bad = std::atoi(argv[2]);
  const double timeout = argc > 3 ? std::atof(argv[3]) : 60.0;
  return tprun::run_guarded([&] {
    tprun::SessionOptions o;
    o.log_dir = "";
    o.comm_timeout_s = timeout;
    tprun::Session session(&argc, &argv, o);
    auto mesh = session.make_mesh({});
    mesh->world().barrier();
    if (session.rank() == bad) {
      if (mode == "throw") throw std::runtime_error("planted failure on the bad rank");
      if (mode == "signal") std::raise(SIGKILL);
      if (mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(600));
    }
    at::Tensor t = at::ones({1024});
    mesh->world().all_reduce(t);
    return 0;
  });
}
