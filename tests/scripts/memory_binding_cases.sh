#!/usr/bin/env bash
# Per-request memory checks and CPU binding, one case per ctest entry:
#   oversized_run       `tprun run` under a 4 GiB address-space limit (ulimit -v) with a request
#                       far too large among normal ones: it is `failed` with the estimate and
#                       the available memory, the others are done, exit 6, no SIGABRT
#   oversized_run_tp2   the same at tp 2: both ranks of the group refuse alike (no hang)
#   oom_converted       the same with the estimate off (TPRUN_MEMORY_CHECK=0): the allocation
#                       failure itself fails the request (no SIGABRT), its record naming the request,
#                       the memory it asked for, the device and what is left there
#                       (runtime/out_of_memory.h); the others are done
#   oversized_generate  `tprun generate` of such an image: exit 6 with both numbers, no abort
#   oom_tp2_ends_job    the same at tp 2: the group cannot skip the request, so the job ends at
#                       once (exit 6, no hang) naming it, unrecorded so that the rerun resumes from it
#   oom_generate        `tprun generate` running out: exit 6 naming the request, no image
#   binding_warns       `mpirun -np 1 --bind-to core` warns once with the fix; `--bind-to none` does not
#   threads             --threads beyond the rank's CPUs warns; SLURM_CPUS_PER_TASK sets the threads
# usage: memory_binding_cases.sh CASE TPRUN MPIRUN
set -u
case_name=$1 tprun=$2 mpirun=$3
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL [$case_name]: $*"; echo "--- output:"; cat "$work/out" 2>/dev/null; exit 1; }
# run LIMIT_S CMD...: runs with a hard time limit, sets $rc.
run() {
  local limit=$1; shift
  timeout -k 5 "$limit" "$@" >"$work/out" 2>&1; rc=$?
  [ "$rc" -eq 124 ] && fail "hung: still running after ${limit}s"
  return 0
}
no_abort() {
  grep -q -E 'SIGABRT|Aborted|signal 6|terminate called|MPI_ABORT' out && fail "aborted instead of failing the request"
  return 0
}
limit_kib=$((4 * 1024 * 1024))  # ulimit -v 4 GiB, as the hostile run

model() {
  "$tprun" init-model "$work/model" --arch flux --preset tiny >/dev/null 2>&1 || fail "init-model"
  # FLUX's shift grows with the image's tokens: at 16384² (1M tokens) exp(mu) overflows float32 and the
  # request is refused for its schedule before it allocates anything. A schedule sized for 1M tokens keeps
  # these cases about memory.
  sed -i 's/"max_image_seq_len": 4096/"max_image_seq_len": 1048576/' "$work/model/scheduler/scheduler_config.json"
}
job() {  # TP
  cat >job.toml <<EOF
model = "$work/model"
requests = "req.jsonl"
[parallel]
tp = $1
[defaults]
steps = 2
max_sequence_length = 32
seed = 1
[output]
dir = "$work/out-job"
EOF
  cat >req.jsonl <<'EOF'
{"id": "small1", "prompt": "a red fox", "height": 64, "width": 64}
{"id": "huge", "prompt": "a red fox", "height": 16384, "width": 16384}
{"id": "small2", "prompt": "a lighthouse", "height": 64, "width": 96}
EOF
}
check_results() {
  local res=out-job/results.jsonl
  [ -f "$res" ] || fail "no results.jsonl"
  grep '"id":"huge"' "$res" | grep -q '"status":"failed"' || fail "huge not failed: $(cat "$res")"
  grep '"id":"huge"' "$res" | grep -q -E 'needs about [0-9.]+ GiB of memory.*only [0-9.]+ [GM]iB is available' ||
    fail "huge's error lacks the estimate and the available memory: $(grep huge "$res")"
  grep '"id":"huge"' "$res" | grep -q 'vae_tiling=true' || fail "no hint"
  for id in small1 small2; do
    grep "\"id\":\"$id\"" "$res" | grep -q '"status":"done"' || fail "$id not done: $(cat "$res")"
  done
  [ -f out-job/images/small1.png ] && [ -f out-job/images/small2.png ] || fail "small images missing"
}

case $case_name in
oversized_run)
  model; job 1
  run 300 bash -c "ulimit -v $limit_kib && exec $mpirun -np 1 $tprun run job.toml --log-dir '' --progress none"
  no_abort
  [ "$rc" -eq 6 ] || fail "exit $rc (a job with a failed request exits 6)"
  check_results
  ;;
oversized_run_tp2)
  model; job 2
  run 300 bash -c "ulimit -v $limit_kib && exec $mpirun -np 2 --oversubscribe $tprun run job.toml --log-dir '' --progress none"
  no_abort
  [ "$rc" -eq 6 ] || fail "exit $rc (a job with a failed request exits 6)"
  check_results
  grep -q 'on TP rank 0 of 2' out-job/results.jsonl || fail "the refusing rank of the group is not named"
  ;;
oom_converted)
  # The estimate switched off: the allocation failure itself becomes the request's error, naming the
  # request, the memory asked for and what is left; the other requests finish.
  model; job 1
  run 300 bash -c "ulimit -v $limit_kib && exec $mpirun -np 1 -x TPRUN_MEMORY_CHECK=0 $tprun run job.toml --log-dir '' \
    --progress none"
  no_abort
  [ "$rc" -eq 6 ] || fail "exit $rc (a job with a failed request exits 6)"
  res=out-job/results.jsonl
  grep '"id":"huge"' "$res" | grep -q '"status":"failed"' || fail "huge not failed: $(cat "$res")"
  grep '"id":"huge"' "$res" | grep -q "ran out of memory while generating (.*can't allocate memory" ||
    fail "the allocation failure is not the error: $(grep huge "$res")"
  grep '"id":"huge"' "$res" | grep -q -E "request 'huge' ran out of memory while generating \(asked for [0-9.]+ [KMGT]?i?B on cpu, [0-9.]+ [KMGT]?i?B available there now" ||
    fail "the error does not name the request, the memory asked for and what is left: $(grep huge "$res")"
  grep '"id":"huge"' "$res" | grep -q 'tprun plan' || fail "no hint: $(grep huge "$res")"
  for id in small1 small2; do
    grep "\"id\":\"$id\"" "$res" | grep -q '"status":"done"' || fail "$id not done: $(cat "$res")"
  done
  ;;
oversized_generate)
  model
  run 300 bash -c "ulimit -v $limit_kib && exec $mpirun -np 1 $tprun generate --model model --prompt fox \
    --height 4096 --width 4096 --steps 2 --max-sequence-length 32 --out x.png --log-dir ''"
  no_abort
  [ "$rc" -eq 6 ] || fail "exit $rc, expected 6 (request error)"
  grep -q -E '4096x4096 \(batch 1\) needs about [0-9.]+ GiB of memory \(VAE decode' out || fail "no estimate"
  grep -q -E 'only [0-9.]+ [GM]iB is available \(RLIMIT_AS \(ulimit -v\): 4.00 GiB limit' out ||
    fail "the limit is not named"
  [ -f x.png ] && fail "wrote an image"
  # The estimate follows the memory features: vae_tiling bounds the decode by one tile plus the
  # 3-channel image buffers (~70 B a pixel; the tiny VAE's untiled decode ~240), so the same
  # refusal names a far smaller decode.
  decode_gib() { grep -o -E 'needs about [0-9.]+ GiB of memory \(VAE decode [0-9.]+ GiB' out | grep -o -E '[0-9.]+ GiB$' |
    cut -d' ' -f1; }
  gen16k() {
    run 120 bash -c "ulimit -v $limit_kib && exec $mpirun -np 1 $tprun generate --model model --prompt fox \
      --height 16384 --width 16384 --steps 1 --max-sequence-length 32 --out x.png --log-dir '' $*"
    no_abort
    [ "$rc" -eq 6 ] || fail "16384² $*: exit $rc"
  }
  gen16k; plain=$(decode_gib)
  gen16k --memory vae_tiling=true; tiled=$(decode_gib)
  [ -n "$plain" ] && [ -n "$tiled" ] || fail "no decode estimate in the refusals"
  awk "BEGIN{exit !($tiled * 3 < $plain)}" || fail "vae_tiling did not shrink the decode estimate ($plain -> $tiled GiB)"
  grep -q 'vae_tiling=true' out && fail "hinted vae_tiling while it is on"
  ;;
oom_tp2_ends_job)
  # 3.25 GiB: at 4 GiB a rank's half of huge's activations can just fit (then it computes for hours).
  model; job 2
  run 300 bash -c "ulimit -v $((limit_kib - 768 * 1024)) && exec $mpirun -np 2 --oversubscribe -x TPRUN_MEMORY_CHECK=0 $tprun run job.toml \
    --log-dir '' --progress none"
  [ "$rc" -ne 0 ] || fail "exit 0 although a rank of the group ran out of memory"
  grep -q -E "request 'huge' ran out of memory while generating \(asked for [0-9.]+ [KMGT]?i?B on cpu" out ||
    fail "the job's end does not name the request and the memory"
  grep -q -E 'On TP rank [01] of 2 \(replica 0\) the group cannot go on in step' out || fail "the rank is not named"
  grep -q 'the job resumes from this request' out || fail "no word on resuming"
  # Not recorded: the rerun runs it again (after it is made to fit).
  grep -q '"id":"huge"' out-job/results.jsonl 2>/dev/null && fail "huge recorded although the job ended on it"
  ;;
oom_generate)
  model
  run 300 bash -c "ulimit -v $limit_kib && exec $mpirun -np 1 -x TPRUN_MEMORY_CHECK=0 $tprun generate --model model \
    --prompt fox --height 16384 --width 16384 --steps 1 --max-sequence-length 32 --out x.png --log-dir ''"
  no_abort
  [ "$rc" -eq 6 ] || fail "exit $rc, expected 6 (request error)"
  grep -q -E "the request \(16384x16384, seed 0\) ran out of memory while generating \(asked for [0-9.]+ [KMGT]?i?B on cpu" out ||
    fail "the error does not name the request and the memory"
  [ -f x.png ] && fail "wrote an image"
  ;;
binding_warns)
  run 60 "$mpirun" -np 1 --bind-to core "$tprun" env
  [ "$rc" -eq 0 ] || fail "exit $rc"
  n=$(grep -c 'CPU binding: Open MPI bound' out || true)
  [ "$n" -eq 1 ] || fail "expected one binding warning, got $n"
  grep -q -- '--bind-to none' out && grep -q -- '--map-by slot:PE=' out || fail "the warning lacks the fix"
  run 60 "$mpirun" -np 1 --bind-to none "$tprun" env
  [ "$rc" -eq 0 ] || fail "exit $rc"
  grep -q 'CPU binding' out && fail "--bind-to none warned"
  if [ "$(nproc)" -ge 4 ]; then  # two ranks on two cores of a larger node leave most of it idle
    run 60 "$mpirun" -np 2 --bind-to core "$tprun" env
    [ "$(grep -c 'CPU binding: Open MPI bound the 2 rank' out || true)" -eq 1 ] || fail "-np 2: one warning expected"
  fi
  ;;
threads)
  run 60 "$mpirun" -np 1 --bind-to core "$tprun" env --threads 4
  [ "$rc" -eq 0 ] || fail "exit $rc"
  grep -q -- '--threads 4 exceeds the 1 CPU(s) this rank may run on' out || fail "no --threads warning"
  grep -q 'threads=4' out || fail "--threads not honoured"
  run 60 "$mpirun" -np 1 --bind-to none -x SLURM_CPUS_PER_TASK=1 "$tprun" env
  [ "$rc" -eq 0 ] || fail "exit $rc"
  grep -q 'threads=1' out || fail "SLURM_CPUS_PER_TASK=1 not honoured"
  grep -q 'SLURM_CPUS_PER_TASK=1' out || fail "the thread source is not logged"
  grep -q 'exceeds' out && fail "warned without --threads"
  ;;
*)
  echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
