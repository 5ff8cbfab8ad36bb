#!/usr/bin/env bash
# Hostile input, parsers and limits, one case per ctest entry:
#   address_space_limit  `tprun run` under several tight `ulimit -v` values, 3 times each, with
#                        --threads 16: each run ends (exit 0, or a clean error) within a bound and
#                        never hangs in the thread pools; a limit that lowers the threads says so
#   shard_wrap           --shard 0/4294967297 (wrapped to chunk 0 of 1 before), signs, spaces and
#                        counts past the number of requests: config errors naming --shard, no chunk
#                        folder written
#   hdf5_full            an HDF5 store on a full tmpfs: I/O error (exit 7) naming the store file
#                        and "No space left on device", no HDF5 error stack on the console (root only:
#                        it mounts a tmpfs; elsewhere it says SKIP and passes)
#   comm_timeout_values  --comm-timeout -1, nan, inf, 1e-9, 1e300 (once silently "no deadline"): config
#                        errors naming the option; 0 (documented: no deadline), 0.5 and 1800 run
#   threads_values       --threads -1, 4097, 2147483647 (once accepted: env reported 2147483647 threads): config
#                        error naming --threads; 0, 1, 2 run
#   memory_toml_syntax   --memory with a TOML syntax error: the parse error and its column, not
#                        "is not a strategy"
#   int64_message        INT64_MAX in a number field of a manifest or request is printed as written (not
#                        through a double); a height of INT64_MAX is refused by the request bounds (exit 3)
#   png_folder           a folder where a done request's PNG belongs: named as a folder, not
#                        "shorter than a PNG signature"
#   plan_world           `plan --world 2147483647` (a wrapped `int tp`, SIGFPE after 15-27 s), the same
#                        world from OMPI_COMM_WORLD_SIZE / WORLD_SIZE / SLURM_NTASKS, a manifest's tp x dp
#                        past 2^31: config errors naming the option, variable or keys, within seconds;
#                        --world 65536 (the bound) plans
#   plan_overflow        `plan --height 4000000000 --width 4000000000` (planned 1024x1024 and "fits"),
#                        --batch / --stage-requests 9223372036854775807, a side past 64 bits: exit 3
#                        naming the flag and its bound; 16384x16384 is planned as asked; --json with a
#                        flag error (exit 3) or an unknown flag (exit 2) prints a JSON error object
#   inspect_tp           `inspect QWEN --tp 100000000` (a per-rank list past 1.1 GB) and --tp 2147483647
#                        (spun): exit 3 naming --tp at once; --tp 65536 answers within seconds, the
#                        pipeline's reason on every component; `verify --tp` likewise
#   verify_tolerance     `verify --tolerance nan` (passed every comparison) and -1, inf: exit 3 naming it
#   init_model_paths     `init-model /proc/x` and `init-model FILE/sub` (exit 1 "internal error:
#                        filesystem error"): an I/O error naming the folder (exit 7), a config error
#                        naming FILE (exit 3); nothing left behind
# (header_200k, the quadratic safetensors header parse, is a unit test: tests/unit/test_limits.cpp.)
# usage: hostile_limits.sh CASE TPRUN MPIRUN
set -u
case_name=$1 tprun=$2 mpirun=$3
[[ $tprun == */* ]] && tprun=$(realpath "$tprun")
work=$(mktemp -d)
cleanup() {
  mountpoint -q "$work/small" 2>/dev/null && umount -l "$work/small"
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
fail() { echo "FAIL [$case_name]: $*"; echo "--- output:"; cat "$work/out" 2>/dev/null | head -n 60; exit 1; }
# run LIMIT_S CMD...: runs with a hard time limit, sets $rc; a run past the limit is a hang.
run() {
  local limit=$1; shift
  timeout -k 5 "$limit" "$@" </dev/null >"$work/out" 2>&1; rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then fail "hung: still running after ${limit}s: $*"; fi
  return 0
}
crashed() {
  grep -aqE 'Segmentation fault|core dumped|Aborted|Bus error|signal (4|6|7|8|11)|terminate called|MPI_ABORT' \
    "$work/out"
}
expect_exit() {  # CODE TEXT...: the last run exited CODE and printed every TEXT
  local code=$1; shift
  crashed && fail "crashed"
  [ "$rc" -eq "$code" ] || fail "exit $rc, expected $code"
  local t
  for t in "$@"; do grep -aqF -- "$t" "$work/out" || fail "the output lacks '$t'"; done
  return 0
}
model() {
  "$tprun" init-model "$work/model" --arch flux --preset tiny >/dev/null 2>&1 || fail "init-model"
}
job() {  # OUT [EXTRA OUTPUT LINES]: job.toml with three small requests into OUT
  cat >req.jsonl <<'EOF'
{"id": "a", "prompt": "a red fox", "height": 32, "width": 32}
{"id": "b", "prompt": "a lighthouse", "height": 32, "width": 32}
{"id": "c", "prompt": "a bowl of fruit", "height": 32, "width": 32}
EOF
  cat >job.toml <<EOF
model = "$work/model"
requests = "req.jsonl"
[parallel]
tp = 1
[defaults]
steps = 2
max_sequence_length = 32
seed = 1
[output]
dir = "$1"
${2:-}
EOF
}
tprun_run() {  # LIMIT_S ARGS...: tprun run under mpirun -np 1
  local limit=$1; shift
  run "$limit" "$mpirun" -np 1 --oversubscribe "$tprun" run "$@" --progress none --log-dir ''
}

case $case_name in
address_space_limit)
  model; job "$work/out-job"
  # What tprun itself takes at start-up (libraries, MPI): read under a limit far above it.
  run 120 bash -c "ulimit -v 100000000 && exec $mpirun -np 1 $tprun env --log-level debug --log-dir ''"
  base=$(grep -aoE '[0-9]+ KiB in use at start-up' out | head -n 1 | cut -d' ' -f1)
  [ -n "$base" ] || fail "tprun env --log-level debug under ulimit -v printed no address-space line"
  # The reported limit (2900000 KiB) left about 70 MiB above that: at::set_num_threads(16) then hung
  # in pthreadpool_create (a thread stack could not be mapped). 16 threads need ~120 MiB of stacks.
  for extra_mib in 70 200 600; do
    kib=$((base + extra_mib * 1024))
    for try in 1 2 3; do
      rm -rf "$work/out-job"
      run 240 bash -c "ulimit -v $kib && exec $mpirun -np 1 $tprun run job.toml --threads 16 --progress none \
        --log-dir ''"
      crashed && fail "ulimit -v $kib (+$extra_mib MiB), try $try: crashed"
      echo "ulimit -v $kib (+$extra_mib MiB), try $try: exit $rc;" \
        "$(grep -aoE 'using [0-9]+ thread\(s\) instead of [0-9]+' out | head -n 1)"
      case $rc in
      0) [ -f "$work/out-job/images/c.png" ] || fail "ulimit -v $kib: exit 0 without the images" ;;
      3 | 6 | 7) grep -aqE 'error|request [a-c] failed' out || fail "ulimit -v $kib: exit $rc without an error line" ;;
      *) fail "ulimit -v $kib (+$extra_mib MiB), try $try: exit $rc (expected 0 or a clean error)" ;;
      esac
      if [ "$extra_mib" -eq 70 ]; then
        grep -aq 'address-space limit .*: using 1 thread(s) instead of 16' out ||
          fail "ulimit -v $kib: no message that the threads were lowered"
      fi
    done
  done
  ;;
shard_wrap)
  model; job "$work/out-job"
  for spec in 0/4294967297 4294967296/4294967297 0/18446744073709551617 -0/2 +0/2 " 0/2" "0/ 2" 0/2x 0x0/2 \
              1/-2 0/0 2/2 0/10000001; do
    tprun_run 120 job.toml --shard "$spec"
    expect_exit 3 "--shard"
    grep -aq "config error" out || fail "--shard '$spec': not a config error"
  done
  # Counts past the number of requests (3): refused on every chunk, also on the non-empty ones.
  for spec in 0/4 1/4 3/4 0/1000; do
    tprun_run 120 job.toml --shard "$spec"
    expect_exit 3 "--shard" "req.jsonl holds only 3 request(s)"
  done
  ls "$work/out-job" 2>/dev/null | grep -q '^shard-' &&
    fail "a refused --shard left a chunk folder: $(ls "$work/out-job")"
  # A count up to the number of requests runs (the chunk with one request).
  tprun_run 240 job.toml --shard 2/3
  expect_exit 0
  [ -f "$work/out-job/shard-2-of-3/images/c.png" ] || fail "--shard 2/3 did not write its image"
  ;;
hdf5_full)
  model
  mkdir -p "$work/small"
  mount -t tmpfs -o size=2m tmpfs "$work/small" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs (not root)"; exit 0; }
  # Enough room for the store's metadata, not for the image data of the three requests.
  cat >req.jsonl <<'EOF'
{"id": "a", "prompt": "a red fox", "height": 256, "width": 256}
{"id": "b", "prompt": "a lighthouse", "height": 256, "width": 256}
{"id": "c", "prompt": "a bowl of fruit", "height": 256, "width": 256}
EOF
  cat >job.toml <<EOF
model = "$work/model"
requests = "req.jsonl"
[defaults]
steps = 1
max_sequence_length = 32
seed = 1
[output]
dir = "$work/small/out"
formats = ["hdf5"]
EOF
  avail=$(($(stat -f -c '%a * %S' "$work/small")))
  head -c $((avail - 150 * 1024)) /dev/zero >"$work/small/filler"
  run 300 "$mpirun" -np 1 "$tprun" run job.toml --progress none --log-dir ''
  expect_exit 7 "I/O error" "No space left on device" "$work/small/out/store/"
  grep -aqE 'HDF5-DIAG|#[0-9]+: .*H5' out && fail "HDF5 printed its error stack"
  grep -a "I/O error" out | head -n 1
  ;;
comm_timeout_values)
  for v in -1 nan inf -inf 1e-9 0.0001 1e300; do
    run 60 "$mpirun" -np 1 "$tprun" env --comm-timeout="$v"
    expect_exit 3 "--comm-timeout"
  done
  for v in 0 0.5 1800; do
    run 60 "$mpirun" -np 1 "$tprun" env --comm-timeout="$v"
    expect_exit 0
  done
  ;;
threads_values)
  for v in -1 4097 2147483647; do
    run 60 "$mpirun" -np 1 "$tprun" env --threads="$v"
    expect_exit 3 "--threads"
  done
  for v in 0 1 2; do
    run 60 "$mpirun" -np 1 "$tprun" env --threads="$v"
    expect_exit 0
  done
  ;;
memory_toml_syntax)
  model
  for spec in 'device_map={"transformer"="cpu"' 'device_map={transformer="cpu",}' 'layerwise_casting=[1,' \
              'offload="unterminated'; do
    run 120 "$mpirun" -np 1 "$tprun" generate --model "$work/model" --prompt x --height 32 --width 32 --steps 1 \
      --out "$work/x.png" --memory "$spec"
    expect_exit 3 "--memory" "not valid TOML" "column"
    grep -aq "is not a strategy" out && fail "--memory '$spec' reported as a string value"
    [ -e "$work/x.png" ] && fail "an image was written"
  done
  ;;
int64_message)
  model; job "$work/out-job"
  max=9223372036854775807
  # Integers in a number field: printed as written, not through a double (9.223372036854776e+18,
  # 9223372036854776000).
  through_double() { grep -aqE '9\.22337203685477[0-9]*e\+18|9223372036854776000|9223372036854775808' out; }
  for kv in defaults.guidance=$max defaults.true_cfg_scale=$max memory.vae_tile_overlap=$max; do
    tprun_run 120 job.toml --set "$kv"
    expect_exit 3 "${kv%%=*}: $max is outside"
    through_double && fail "--set $kv: the integer printed through a double"
  done
  echo "{\"id\": \"a\", \"prompt\": \"x\", \"guidance\": $max}" >req.jsonl
  tprun_run 120 job.toml
  expect_exit 3 "req.jsonl:1: guidance: $max is outside"
  through_double && fail "a request's guidance printed through a double"
  # A side of INT64_MAX: refused by the bound every request shares (issue 31), printed as written,
  # never a suggestion that wraps to -9223372036854775808.
  run 120 "$mpirun" -np 1 "$tprun" generate --model "$work/model" --prompt x --height $max --width 32 --steps 1 \
    --out "$work/x.png"
  expect_exit 3 "--height: $max is outside [1, 16384]"
  grep -aq -- '-9223372036854775808' out && fail "the suggestion wrapped around"
  ;;
png_folder)
  model; job "$work/out-job"
  tprun_run 240 job.toml
  expect_exit 0
  rm "$work/out-job/images/b.png" && mkdir "$work/out-job/images/b.png"
  tprun_run 240 job.toml
  crashed && fail "crashed"
  grep -aq "shorter than a PNG signature" out && fail "a folder reported as a short PNG"
  grep -aqF "images/b.png" out || fail "the folder is not named"
  grep -aq "a folder, not a file" out || fail "not said to be a folder"
  ;;
plan_world)
  model
  for w in 2147483647 65537 0 -1 4294967297 99999999999999999999; do
    run 20 "$tprun" plan --model "$work/model" --world "$w"
    expect_exit 3 "--world" "outside [1, 65536]"
  done
  run 20 "$tprun" plan --model "$work/model" --world 12x
  expect_exit 3 "--world '12x' is not an integer"
  # The same world from a launcher's variables (no mpirun: plan reads them as it starts).
  for vars in "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2147483647" "RANK=0 WORLD_SIZE=2147483647" \
              "SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2147483647" \
              "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=70000"; do
    run 20 env $vars "$tprun" plan --model "$work/model"
    expect_exit 3 "${vars##* }" "at most 65536"
  done
  # A manifest's tp x dp (4096 x 1048576 = 2^32, an int product wrapped to 0).
  echo '{"id": "a", "prompt": "x"}' >req.jsonl
  printf 'model = "%s"\nrequests = "req.jsonl"\n[parallel]\ntp = 4096\ndp = 1048576\n' "$work/model" >big.toml
  run 20 "$tprun" plan big.toml
  expect_exit 3 "parallel.tp 4096 x parallel.dp 1048576" "at most 65536"
  # The bound itself plans, in seconds (divisors only; tp past the heads refused with the reason).
  run 60 "$tprun" plan --model "$work/model" --world 65536 --device-memory 1TiB --json
  expect_exit 0
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['chosen']['dp'] * p['chosen']['tp'] == 65536, p['chosen']; assert all(r['tp'] & (r['tp'] - 1) == 0 for r in p['refused'])" out ||
    fail "--world 65536: no plan of 65536 ranks"
  ;;
plan_overflow)
  model
  for args in "--height 4000000000 --width 4000000000" "--height 2147483648 --width 2147483648" \
              "--height 16400 --width 16" "--height 99999999999999999999 --width 16"; do
    run 20 "$tprun" plan --model "$work/model" $args
    expect_exit 3 "--height" "[1, 16384]"
    grep -aq "fits" out && fail "$args: a plan was printed"
  done
  for flag in batch stage-requests; do
    for v in 9223372036854775807 -9223372036854775808 1e3; do
      run 20 "$tprun" plan --model "$work/model" --$flag $v
      expect_exit 3 "--$flag"
    done
  done
  run 20 "$tprun" plan --model "$work/model" --batch 1025
  expect_exit 3 "--batch 1025 is outside [1, 1024]"
  # The largest image is planned as asked (not 1024x1024), its estimate in the GiB, not "0 B".
  timeout 60 "$tprun" plan --model "$work/model" --height 16384 --width 16384 --batch 1024 --json </dev/null \
    >json.out 2>"$work/out"; rc=$?
  crashed && fail "16384x16384: crashed"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || fail "16384x16384: exit $rc"
  python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
assert (p['request']['height'], p['request']['width'], p['request']['batch']) == (16384, 16384, 1024), p['request']
assert all(c['activations'] > 1 << 40 for c in p['candidates']), [c['activations'] for c in p['candidates']]" json.out ||
    fail "16384x16384 batch 1024 not planned as asked"
  # --json: a JSON error object on stdout for a flag error (exit 3) and an unknown flag (exit 2).
  for args in "--height 4000000000 3" "--world 0 3" "--wrold 2 2" "--dtype fp64 3"; do
    set -- $args
    timeout 20 "$tprun" plan --model "$work/model" --json "$1" "$2" </dev/null >json.out 2>"$work/out"; rc=$?
    [ "$rc" -eq "$3" ] || fail "plan --json $1 $2: exit $rc, expected $3"
    python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['error']; assert e['exit_code'] == int(sys.argv[2]) and sys.argv[3] in e['message'], e" \
      json.out "$3" "${1#--}" || fail "plan --json $1 $2: no JSON error on stdout: $(head -c 400 json.out)"
  done
  ;;
inspect_tp)
  "$tprun" init-model "$work/qwen" --arch qwen-image --preset tiny >/dev/null 2>&1 || fail "init-model qwen-image"
  for tp in 100000000 2147483647 65537 -1; do
    run 20 "$tprun" inspect "$work/qwen" --tp $tp
    expect_exit 3 "--tp" "[0, 65536]"
  done
  # The bound answers in seconds: the transformer's heads refuse it, no per-rank list is built.
  run 60 "$tprun" inspect "$work/qwen" --tp 65536 --json
  expect_exit 3
  python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
for c in j['components']:
    if c.get('weights'):
        assert c['tp']['valid'] is False and 'tp 65536' in c['tp']['error'] and 'bytes_per_rank' not in c['tp'], c['tp']" out ||
    fail "--tp 65536: not refused on every component with the pipeline's reason"
  # A component folder that splits nothing (the VAE): one entry per rank, computed once.
  run 60 "$tprun" inspect "$work/qwen/vae" --tp 65536 --json
  expect_exit 0
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['components'][0]['tp']; assert t['valid'] and len(set(t['bytes_per_rank'])) == 1 and len(t['bytes_per_rank']) == 65536" out ||
    fail "inspect vae --tp 65536"
  for tp in 100000000 0 -3; do
    run 60 "$mpirun" -np 1 "$tprun" verify --model "$work/qwen" --component transformer --tp $tp
    expect_exit 3 "--tp" "[1, 65536]"
  done
  ;;
verify_tolerance)
  model
  for tol in nan -1 inf -inf; do
    run 60 "$mpirun" -np 1 "$tprun" verify --model "$work/model" --component transformer --tolerance=$tol
    expect_exit 3 "--tolerance" "finite number >= 0"
    grep -aq "^OK" out && fail "--tolerance $tol: verified OK"
  done
  run 120 "$mpirun" -np 1 "$tprun" verify --model "$work/model" --component transformer --tolerance=0.001
  expect_exit 0 "OK: max abs diff"
  ;;
init_model_paths)
  run 60 "$tprun" init-model /proc/tprun-x --arch flux
  expect_exit 7 "/proc/tprun-x" "I/O error"
  grep -aq "internal error" out && fail "/proc/tprun-x: an internal error"
  echo x >"$work/file"
  for d in "$work/file/sub" "$work/file/sub/deeper"; do
    run 60 "$tprun" init-model "$d" --arch flux
    expect_exit 3 "$work/file is not a folder"
    grep -aq "internal error" out && fail "$d: an internal error"
  done
  [ "$(cat "$work/file")" = x ] || fail "the file was changed"
  ls "$work" | grep -q tmp- && fail "a temporary folder was left: $(ls "$work")"
  ;;
*)
  echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
