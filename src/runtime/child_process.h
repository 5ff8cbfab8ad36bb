#pragma once
// Runs a program as a child process with bounded time and bounded output:
// its stdin fed from memory, its stdout kept up to a limit, the tail of its
// stderr kept for messages. posix_spawn (no fork of the whole rank: safe in
// an MPI process with registered memory), every descriptor of the parent
// closed in the child but the three pipes (they are made O_CLOEXEC), and the
// child killed (SIGKILL) and reaped when the time is up or the caller's
// output limit is passed. Used for the `ffmpeg` program (jobs/video_output.h).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tprun {

struct ChildRun {
  int exit_code = -1;       // the program's exit status; -1 when it was killed or did not start
  int signal = 0;           // the signal that ended it (SIGKILL on a timeout), 0 if none
  bool timed_out = false;   // killed after `timeout_s`
  bool output_cut = false;  // killed because its stdout passed `max_stdout` bytes
  bool stdin_closed = false;  // it stopped reading before all of `input` was written (EPIPE)
  std::string out;          // its stdout (at most max_stdout bytes)
  std::string err_tail;     // the last 4 KiB of its stderr
  double seconds = 0;
  bool ok() const { return exit_code == 0 && !timed_out && !output_cut; }
  // "exit code 1: <stderr tail>", "killed after 30 s (its time limit)", ...
  std::string describe() const;
};

// Runs argv[0] (searched on PATH when it has no '/') with `argv`. `input`
// (input_size bytes, may be null) is written to its stdin, which is then
// closed; stdout is kept up to `max_stdout` bytes. Waits at most `timeout_s`
// seconds. IoError naming the program when it cannot be started (not found,
// not executable).
ChildRun run_child(const std::vector<std::string>& argv, const uint8_t* input, size_t input_size, double timeout_s,
                   size_t max_stdout = 1 << 20);

// The program `name` would run as: `name` itself when it has a '/' and is an
// executable file, else the first executable `name` on PATH; "" if none.
std::string find_program(const std::string& name);

}  // namespace tprun
