#include "runtime/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "runtime/error.h"

extern char** environ;

namespace tprun {
namespace {

constexpr size_t kErrTail = 4096;

bool executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// A pipe whose ends are close-on-exec in the parent (the child gets its end through dup2).
void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_io_error("cannot create a pipe for", "a child process", errno);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The child's descriptors 0, 1, 2 from the pipes; everything else the parent
// holds is O_CLOEXEC (MPI's, ours) or closed by the kernel at exec.
pid_t spawn(const std::vector<std::string>& argv, int in_r, int out_w, int err_w) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_r, 0);
  posix_spawn_file_actions_adddup2(&fa, out_w, 1);
  posix_spawn_file_actions_adddup2(&fa, err_w, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The child starts with default signal handlers (the job's SIGTERM handler is not its business)
  // and an empty mask.
  sigset_t handled, none;
  sigemptyset(&handled);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ, SIGUSR1, SIGUSR2, SIGCHLD}) {
    sigaddset(&handled, sig);
  }
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &handled);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw_io_error("cannot start the program", argv[0], rc);
  return pid;
}

}  // namespace

std::string ChildRun::describe() const {
  std::string tail = err_tail;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
  const std::string said = tail.empty() ? "" : fmt::format(": {}", tail);
  if (timed_out) return fmt::format("killed after {:.0f} s (its time limit){}", seconds, said);
  if (output_cut) return fmt::format("killed: its output passed the limit of {} bytes{}", out.size(), said);
  if (signal != 0) return fmt::format("ended by signal {} ({}){}", signal, ::strsignal(signal), said);
  return fmt::format("exit code {}{}", exit_code, said);
}

std::string find_program(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return executable_file(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    if (executable_file(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

namespace {

// SIGPIPE blocked in this thread while it writes to a child (a child that
// exits early makes the write fail with EPIPE instead of ending the rank);
// one raised meanwhile is taken back before the mask is restored.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeBlock() {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1 && !sigismember(&old_, SIGPIPE)) {
      const timespec zero{0, 0};
      while (::sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t old_;
};

}  // namespace

ChildRun run_child(const std::vector<std::string>& argv, const uint8_t* input, size_t input_size, double timeout_s,
                   size_t max_stdout) {
  if (argv.empty()) throw Error(Error::Kind::Internal, "run_child: no program");
  SigpipeBlock no_sigpipe;
  int in[2], out[2], err[2];
  make_pipe(in);
  make_pipe(out);
  make_pipe(err);
  pid_t pid;
  try {
    pid = spawn(argv, in[0], out[1], err[1]);
  } catch (...) {
    for (int* p : {in, out, err}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
    throw;
  }
  close_fd(in[0]);
  close_fd(out[1]);
  close_fd(err[1]);
  int to_child = in[1], from_out = out[0], from_err = err[0];
  for (int fd : {to_child, from_out, from_err}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (input == nullptr || input_size == 0) close_fd(to_child);

  ChildRun run;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(std::max(0.0, timeout_s)));
  size_t written = 0;
  char buf[65536];
  auto kill_child = [&] { ::kill(pid, SIGKILL); };
  while (from_out >= 0 || from_err >= 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      run.timed_out = true;
      kill_child();
      break;
    }
    const int wait_ms = static_cast<int>(
        std::min<int64_t>(1000, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1));
    pollfd fds[3];
    int n = 0;
    for (int fd : {from_out, from_err}) {
      if (fd >= 0) fds[n++] = {fd, POLLIN, 0};
    }
    if (to_child >= 0) fds[n++] = {to_child, POLLOUT, 0};
    const int rc = ::poll(fds, static_cast<nfds_t>(n), wait_ms);
    if (rc < 0 && errno != EINTR) {
      kill_child();
      break;
    }
    for (int i = 0; rc > 0 && i < n; ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      if (fd == to_child) {
        const ssize_t w = ::write(fd, input + written, std::min<size_t>(input_size - written, 1 << 20));
        if (w > 0) written += static_cast<size_t>(w);
        if (w < 0 && errno == EPIPE) run.stdin_closed = true;
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input_size) close_fd(to_child);
        continue;
      }
      const ssize_t r = ::read(fd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        if (fd == from_out) close_fd(from_out);
        else close_fd(from_err);
        continue;
      }
      if (r < 0) continue;
      if (fd == from_err) {
        run.err_tail.append(buf, static_cast<size_t>(r));
        if (run.err_tail.size() > 2 * kErrTail) run.err_tail.erase(0, run.err_tail.size() - kErrTail);
      } else if (run.out.size() + static_cast<size_t>(r) > max_stdout) {
        run.output_cut = true;
        kill_child();
      } else {
        run.out.append(buf, static_cast<size_t>(r));
      }
    }
    if (run.output_cut) break;
  }
  for (int* fd : {&to_child, &from_out, &from_err}) close_fd(*fd);
  // Reaped in every case; a program that closed its output but keeps running is bounded by the deadline too.
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline && !run.timed_out) {
      run.timed_out = true;
      kill_child();
    }
    ::usleep(2000);
  }
  if (run.err_tail.size() > kErrTail) run.err_tail.erase(0, run.err_tail.size() - kErrTail);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace tprun
