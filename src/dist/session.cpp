#include "dist/session.h"

#include <chrono>
#include <exception>

#include <c10/util/Logging.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "dist/comm_watchdog.h"
#include "dist/device_mesh.h"
#include "dist/mpi_world.h"
#include "dist/nccl_communicator.h"
#include "runtime/cpu_binding.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/thread_budget.h"

#ifdef TPRUN_TORCH_HAS_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace tprun {
namespace {
Session* g_session = nullptr;

// Makes cuda:`index` this process's current device before anything allocates
// CUDA memory: otherwise libtorch's first allocation, a CUDA context or a
// pinned buffer lands on device 0, and every rank of a node crowds onto it.
void set_current_cuda_device(int index) {
#ifdef TPRUN_TORCH_HAS_CUDA
  TPRUN_CUDA_CHECK(cudaSetDevice(index));
  spdlog::debug("current CUDA device set to cuda:{}", index);
#else
  (void)index;
#endif
}
// The one rule of --comm: `auto` picks NCCL or MPI silently; `nccl`, asked for explicitly, is an error
// wherever it cannot be used: a build without NCCL, or any rank that computes on the CPU (--device cpu,
// no GPU visible, a build without CUDA), since NCCL reduces CUDA tensors only. Collective when `comm`
// is nccl (every rank parsed the same --comm): the ranks share what each found, so every rank raises
// the same error, naming the first CPU rank, and none waits for a peer that left.
void check_nccl_usable(dist::CommChoice comm, const DeviceChoice& device) {
  if (comm != dist::CommChoice::Nccl) return;
  if (!dist::nccl_compiled()) {
    throw ConfigError("--comm nccl: this tprun was built without NCCL (libtorch without CUDA, or nccl.h not "
                      "found at configure time); use --comm mpi or --comm auto",
                      true);
  }
  const std::string mine = device.cuda_index < 0 ? device.reason : std::string();
  const auto all = dist::mpi_all_gather_strings(MPI_COMM_WORLD, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    throw ConfigError(fmt::format("--comm nccl: rank {} computes on the CPU ({}), and NCCL reduces CUDA tensors "
                                  "only; use --comm auto (MPI on CPU ranks, NCCL on GPU ranks) or --comm mpi",
                                  r, all[r]),
                      true);
  }
}

}  // namespace

Session* Session::current() { return g_session; }

Session::Session(int* argc, char*** argv, const SessionOptions& options) {
  // A failed libtorch enforce (an allocation the allocator cannot make,
  // above all) must throw c10::Error, which the pipelines turn into a request
  // error, not abort the process.
  FLAGS_caffe2_use_fatal_for_enforce = false;
  // Under `ulimit -v`, before any thread starts: threads must not each reserve a 64 MiB malloc
  // arena of the limit (runtime/thread_budget.h).
  const bool arenas_capped = cap_malloc_arenas_under_address_limit();
  // Log with the launcher's rank (if any) until MPI confirms it.
  auto early = rank_env_from_variables(process_env());
  init_logging({early ? early->rank : 0, early ? early->world : 1, options.log_level, ""});

  dist::mpi_init(argc, argv);
  g_session = this;
  const MpiIdentity mpi = dist::mpi_identity();
  env_ = resolve_rank_env(process_env(), mpi);
  host_ = dist::host_name();
  init_logging({env_.rank, env_.world, options.log_level, options.log_dir});

  device_ = choose_device(options.device, env_.local_rank, cuda_device_count(), cuda_built());
  if (device_.cuda_index >= 0) set_current_cuda_device(device_.cuda_index);
  comm_ = options.comm;
  check_nccl_usable(comm_, device_);

  // CPU threads: ranks of this node that may run on the same CPUs share them.
  cpus_ = affinity_mask_string();
  MPI_Comm local = MPI_COMM_NULL;
  dist::check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env_.rank,
                                      MPI_INFO_NULL, &local),
                  "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  auto masks = dist::mpi_all_gather_strings(local, cpus_);
  MPI_Comm_free(&local);
  int sharing = 0;
  for (const auto& m : masks) sharing += m == cpus_ ? 1 : 0;
  // --threads, else Slurm's --cpus-per-task, else the mask shared fairly
  // (runtime/cpu_binding.h); the node's first rank warns about a launcher
  // binding that leaves most of the node idle.
  const ThreadChoice tc = choose_threads(options.threads, cpus_in_affinity_mask(), sharing, cpus_, process_env());
  threads_ = tc.threads;
  // The thread pools must fit the address-space limit: libtorch's pthreadpool waits forever for a
  // thread that pthread_create could not start.
  const ThreadBudget budget = fit_threads_to_address_space(threads_);
  threads_ = budget.threads;
  const int interop_threads = std::max(1, threads_ / 2);
  if (device_.cuda_index < 0) {
    if (budget.warning) spdlog::warn("{}", *budget.warning);
    set_torch_threads(threads_, interop_threads);
    if (tc.warning && env_.local_rank == 0) spdlog::warn("{}", *tc.warning);
    const auto binding = binding_warning(cpu_binding_facts(process_env(), node_cpus(), cpus_in_affinity_mask(), masks));
    if (binding && env_.local_rank == 0) spdlog::warn("{}", *binding);
  }

  watchdog_ = std::make_unique<dist::CommWatchdog>(
      std::chrono::milliseconds(static_cast<long long>(options.comm_timeout_s * 1000.0)));
  dist::CommWatchdog::set_global(watchdog_.get());

  spdlog::info("tprun rank {}/{} on {} (local {}/{}), environment from {}, device {} ({}), "
               "TP backend {} (--comm {}), "
               "{} thread(s) on CPUs {} shared by {} local rank(s) (threads from {})",
               env_.rank, env_.world, host_, env_.local_rank, env_.local_size, env_.source,
               device_.device, device_.reason, tp_backend(), dist::comm_choice_name(comm_), threads_, cpus_,
               sharing, budget.warning ? tc.reason + ", lowered for the address-space limit" : tc.reason);
  if (device_.cuda_index >= 0 && comm_ == dist::CommChoice::Auto && !dist::nccl_compiled() && env_.rank == 0) {
    spdlog::info("TP collectives on CUDA tensors go through MPI, staged in pinned host memory: this tprun was "
                 "built without NCCL");
  }
  if (budget.limit) {
    // In KiB, the unit of `ulimit -v` (tests/scripts/hostile_limits.sh reads this line).
    spdlog::debug("address-space limit {} KiB (ulimit -v): {} KiB in use at start-up, {} KiB per thread stack, "
                  "malloc arenas {}",
                  *budget.limit / 1024, budget.used / 1024, budget.per_thread / 1024,
                  arenas_capped ? "capped" : "not capped");
  }
  if (cuda_built() && device_.cuda_index < 0 && env_.rank == 0) {
    spdlog::info("CUDA build without a visible GPU: NCCL and CUDA paths are skipped, ranks run on CPU");
  }
}

Session::~Session() {
  watchdog_.reset();
  flush_logs();
  g_session = nullptr;
  // While an exception unwinds, a peer may be blocked in a collective:
  // MPI_Finalize could wait for it forever. The process boundary
  // (run_guarded) decides between finalize and abort instead.
  if (std::uncaught_exceptions() == 0) dist::mpi_finalize();
}

std::unique_ptr<dist::DeviceMesh> Session::make_mesh(const dist::MeshSpec& spec) const {
  dist::MeshContext ctx;
  ctx.cuda_device = device_.cuda_index;
  ctx.comm = comm_;
  ctx.watchdog = watchdog_.get();
  return dist::DeviceMesh::create(spec, ctx);
}

const char* Session::tp_backend() const {
  dist::MeshContext ctx;
  ctx.cuda_device = device_.cuda_index;
  ctx.comm = comm_;
  return dist::tp_device_backend(ctx);
}

}  // namespace tprun
