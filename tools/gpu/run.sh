#!/usr/bin/env bash
# The tprun GPU check: one command on a GPU host, from the bundle that tools/gpu-bundle.sh writes
# (README "Running the GPU check"). Its own time limit is 8 minutes; gpu-report.md and gpu-check.log
# go to $OUT, or to the current folder where OUT is unset, whatever happens.
#
#   run.sh                    on the GPU (every step; about 5 minutes on one H200)
#   run.sh --device cpu       the CPU rehearsal: the same steps on CPU ranks at small sizes
#                             (tools/gpu-bundle.sh runs it where the bundle is made)
#   run.sh --build            build tprun from the carried sources first, even where the prebuilt
#                             binaries start (the fallback is automatic where they do not)
# Options: --python PY (default python3: the one with torch), --limit SECONDS (default 480),
#          --work DIR (default /tmp/tprun-gpu-check; emptied first), --help (this text).
set -u
here=$(cd "$(dirname "$0")" && pwd)
device=cuda limit=480 py=python3 force_build=0 work=/tmp/tprun-gpu-check step_name=""
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --build) force_build=1; shift ;;
    --step) step_name=$2; shift 2 ;;  # internal: one step, in a child under `timeout`
    -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see the header of this file)" >&2; exit 2 ;;
  esac
done
case $device in cuda|cpu) ;; *) echo "run.sh: --device is cuda or cpu" >&2; exit 2 ;; esac
out=${OUT:-$PWD}
report=$out/gpu-report.md log=$out/gpu-check.log

# --- the steps (each runs as `run.sh --step NAME` under its own timeout) --------------------------
# Sizes: the GPU runs the issue's sizes, the CPU rehearsal the same code paths at small ones.
if [ "$device" = cuda ]; then
  # cuda:0, not cuda (= cuda:<local rank>): two ranks share the one GPU in the --comm mpi steps.
  DOUBLE=5 SINGLE=10 IMG=4096 TXT=512 ITERS=5 DEV_FLAG="--device cuda:0"
else
  DOUBLE=1 SINGLE=1 IMG=64 TXT=16 ITERS=2 DEV_FLAG="--device cpu"
fi
note() { echo "$*" >>"$work/notes/$step_name.md"; }
mpi() { "$work/mpi/bin/mpirun" --oversubscribe --bind-to none "$@"; }
tprun() { "$work/bin/tprun" "$@"; }
ref=$work/data/flux_transformer

step_binaries() {
  local bad=0
  for b in "$work"/bin/* "$work"/mpi/bin/*; do
    [ -f "$b" ] || continue
    if ldd "$b" 2>&1 | grep -q "not found"; then
      bad=1; note "- \`$(basename "$b")\` cannot start here: $(ldd "$b" 2>&1 | grep "not found" | awk '{print $1}' | tr '\n' ' ')"
    fi
  done
  [ $bad -eq 0 ] || return 1
  tprun --version || return 1
  mpi -np 1 "$work/bin/tprun" env $DEV_FLAG --log-dir '' || { note "- \`mpirun -np 1 tprun env\` failed (see the log)"; return 1; }
  note "- every binary and MPI plugin finds its libraries; \`tprun env\` ran under the bundled mpirun"
}

step_ctest_gpu() {
  [ -f "$work/ctest/CTestTestfile.cmake" ] || { note "- no gpu tests in the bundle"; return 1; }
  if command -v ctest >/dev/null; then
    (cd "$work/ctest" && ctest --output-on-failure -L gpu) || return 1
  else
    note "- no ctest on this host: the gpu test commands run directly"
    bash "$work/ctest/commands.sh" || return 1
  fi
  [ "$device" = cuda ] || note "- CPU rehearsal: the gpu tests start and skip themselves (no GPU visible)"
}

step_nccl_np1() {
  local comm=nccl
  [ "$device" = cuda ] || comm=auto
  mpi -np 1 "$work/bin/tprun" verify --model "$ref/model" --tp 1 --comm $comm $DEV_FLAG --log-dir '' || return 1
  note "- \`tprun verify --tp 1 --comm $comm\` on one rank"
}

step_mpi_np2() {
  mpi -np 2 "$work/bin/tprun" verify --model "$ref/model" --tp 2 --comm mpi $DEV_FLAG --log-dir '' || return 1
  note "- \`tprun verify --tp 2 --comm mpi\`: two ranks on one device, CUDA tensors staged through pinned host memory"
}

step_parity() {
  local ok=0 d
  for np in 1 2; do
    for dt in fp32 bf16; do
      mpi -np $np "$work/bin/tprun" forward --model "$ref/model" --inputs "$ref/inputs.safetensors" \
          --out "$work/tmp/fwd_${np}_$dt.safetensors" --tp $np --comm mpi $DEV_FLAG --dtype $dt --log-dir '' || { ok=1; continue; }
      local tol=1e-4
      [ $dt = fp32 ] || tol=""
      d=$("$py" "$work/gpu_check.py" compare "$work/tmp/fwd_${np}_$dt.safetensors" "$ref/expected.safetensors" ${tol:+--tol $tol})
      local rc=$?
      note "- tp $np $dt vs diffusers' CPU reference: $d${tol:+ (limit $tol)}"
      [ $rc -eq 0 ] || ok=1
    done
  done
  return $ok
}

step_generate() {
  tprun init-model "$work/tmp/flux-tiny" --arch flux --preset tiny --force >/dev/null || return 1
  mpi -np 1 "$work/bin/tprun" generate --model "$work/tmp/flux-tiny" --prompt "a red fox in snow" \
      --height 64 --width 64 --steps 4 --out "$work/tmp/gen.png" $DEV_FLAG --log-dir '' || return 1
  [ -s "$work/tmp/gen.png" ] || { note "- no image written"; return 1; }
  note "- \`tprun generate\` wrote a 64x64 PNG ($(stat -c %s "$work/tmp/gen.png") bytes)"
}

write_job() {  # write_job NAME PHASES
  mkdir -p "$work/tmp/$1"
  for i in 0 1 2 3 4 5; do echo "{\"id\": \"p$i\", \"prompt\": \"prompt number $i\"}"; done >"$work/tmp/$1/requests.jsonl"
  cat >"$work/tmp/$1/job.toml" <<TOML
model = "$work/tmp/flux-tiny"
dtype = "fp32"
requests = "requests.jsonl"
[parallel]
tp = 1
dp = 1
device = "$device"
[schedule]
phases = "$2"
[defaults]
height = 64
width = 64
steps = 3
seed = 1
[output]
dir = "out"
formats = ["png"]
TOML
}

run_job() {  # run_job NAME LABEL: the job write_job wrote, on one rank; every request done
  mpi -np 1 "$work/bin/tprun" run "$work/tmp/$1/job.toml" --log-dir '' || return 1
  local done_n
  done_n=$(grep -c '"status": *"done"' "$work/tmp/$1/out/results.jsonl" 2>/dev/null)
  note "- $2: $done_n of 6 requests done"
  [ "$done_n" = 6 ]
}

step_job() {
  write_job job together
  run_job job "\`tprun run\`"
}

step_plan_staged() {
  write_job staged staged
  tprun plan "$work/tmp/staged/job.toml" --device "$device" >"$work/tmp/plan.txt" 2>&1
  local rc=$?
  cat "$work/tmp/plan.txt"
  [ $rc -eq 0 ] || { note "- \`tprun plan\` failed"; return 1; }
  note "- \`tprun plan\` against this device's free memory:"
  note '```'
  head -n 25 "$work/tmp/plan.txt" >>"$work/notes/$step_name.md"
  note '```'
  run_job staged "staged phases job"
}

step_make_checkpoint() {
  local dev=cpu
  [ "$device" = cuda ] && dev=cuda
  "$py" "$work/gpu_check.py" make-flux "$work/tmp/flux-width" --double $DOUBLE --single $SINGLE --device $dev \
      >"$work/tmp/make.json" || return 1
  note "- FLUX.1-width transformer, $DOUBLE double + $SINGLE single blocks, bf16: $(cat "$work/tmp/make.json")"
}

step_load() {
  local m=$work/tmp/flux-width rc=0
  [ -f "$m/config.json" ] || { note "- no checkpoint (make_checkpoint failed)"; return 1; }
  note "| read | tp | wall s | GB/s read | host peak RSS | device memory held after the load |"
  note "| --- | --- | --- | --- | --- | --- |"
  # For each tp: a plain sequential read of as many bytes as rank 0 reads, then the model's own load
  # (shard-on-load) to the device as rank 0. The checkpoint was just written: all from the page cache.
  for tp in 1 2 4; do
    tprun bench load --model "$m" --tp $tp --rank 0 --mode sequential --drop >"$work/tmp/load_seq_$tp.json" &&
      "$py" "$work/gpu_check.py" load-row "$work/tmp/load_seq_$tp.json" >>"$work/notes/$step_name.md" || rc=1
    tprun bench load --model "$m" --tp $tp --rank 0 --mode model-load --dtype bf16 $DEV_FLAG >"$work/tmp/load_$tp.json" &&
      "$py" "$work/gpu_check.py" load-row "$work/tmp/load_$tp.json" >>"$work/notes/$step_name.md" || rc=1
  done
  note ""
  note "Host peak RSS is the whole process (libtorch, CUDA context); the guide's anchor for FLUX.1-dev's full load is 6.8 GB."
  return $rc
}

step_step_time() {
  local m=$work/tmp/flux-width
  [ -f "$m/config.json" ] || { note "- no checkpoint (make_checkpoint failed)"; return 1; }
  "$py" "$work/gpu_check.py" inputs "$work/tmp/step_in.safetensors" --img $IMG --txt $TXT || return 1
  local dev=cpu
  [ "$device" = cuda ] && dev=cuda
  "$py" "$work/gpu_check.py" diffusers-step "$m" "$work/tmp/step_in.safetensors" --device $dev --dtype bf16 \
      --iters $ITERS --json "$work/tmp/diffusers_step.json" --out "$work/tmp/diffusers_step.safetensors" || return 1
  mpi -np 1 "$work/bin/tprun" bench step --model "$m" --inputs "$work/tmp/step_in.safetensors" --dtype bf16 \
      --iters $ITERS --warmup 1 --no-bare --out "$work/tmp/tprun_step.safetensors" $DEV_FLAG --log-dir '' \
      --log-level warn >"$work/tmp/tprun_step.txt" || return 1
  cat "$work/tmp/tprun_step.txt"
  "$py" - "$work/tmp/tprun_step.txt" "$work/tmp/diffusers_step.json" $DOUBLE $SINGLE $IMG $TXT \
      >>"$work/notes/$step_name.md" <<'PY'
import json, sys
t = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
d = json.load(open(sys.argv[2]))
double, single, img, txt = (int(x) for x in sys.argv[3:7])
ts = t.get("median_s") or t.get("forward_s") or t.get("step_s")
ds = d["median_s"]
# FLUX.1-dev has 19 double + 38 single blocks: (19 + 38) / (double + single) times this model's blocks when
# double : single is 1 : 2 as here; the embedders and the final layer are counted with the blocks (an upper bound).
scale = (19 + 38) / (double + single)
print(f"- {img} image + {txt} text tokens, bf16, {double} double + {single} single blocks at FLUX.1 width")
print()
print(f"| | forward s (median) | projected FLUX.1-dev step s | projected 28 steps s |")
print(f"| --- | --- | --- | --- |")
for name, s in (("tprun", ts), ("diffusers eager", ds)):
    print(f"| {name} | {s:.4f} | {s * scale:.3f} | {s * scale * 28:.2f} |")
print()
print(f"- tprun / diffusers: {ts / ds:.2f}x; anchor: about 6.7 s for FLUX.1-dev's 28 steps on one H100, eager")
PY
  d=$("$py" "$work/gpu_check.py" compare "$work/tmp/tprun_step.safetensors" "$work/tmp/diffusers_step.safetensors")
  note "- tprun vs diffusers output (bf16, same weights and inputs): $d"
}

if [ -n "$step_name" ]; then
  cd "$work" || exit 1
  "step_$step_name"
  exit $?
fi

# --- the driver ---------------------------------------------------------------------------------
mkdir -p "$out"
start=$(date +%s)
: >"$log"
{
  echo "# tprun GPU check"
  echo
  echo "- started $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname 2>/dev/null || cat /etc/hostname), device $device, limit ${limit} s"
  echo "- bundle: $(cat "$here/BUNDLE" 2>/dev/null | head -n 3 | tr '\n' ' ')"
} >"$report"
say() { echo "$*" | tee -a "$report"; }
left() { echo $((start + limit - $(date +%s))); }
fail_setup() { say "- **setup failed**: $*"; say ""; say "Verdict: FAILED before any step ran."; exit 1; }
step_pid=""
trap '[ -n "$step_pid" ] && kill "$step_pid" 2>/dev/null
      say ""; say "Verdict: STOPPED by a signal after $(( $(date +%s) - start )) s (the steps above finished)."; exit 143' TERM INT

rm -rf "$work" && mkdir -p "$work/notes" "$work/tmp" || fail_setup "cannot make the work folder $work"
# tar with xz, else python's tarfile (an image without xz-utils).
tar -xJf "$here/payload.tar.xz" -C "$work" 2>>"$log" || \
  "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/payload.tar.xz" "$work" 2>>"$log" || \
  fail_setup "cannot unpack $here/payload.tar.xz into $work (see gpu-check.log)"
cp "$here/gpu_check.py" "$work/" 2>/dev/null

# The host's torch: its lib folder serves libtorch and, through the nvidia wheels beside it, CUDA.
info=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or "none"); print(torch.cuda.is_available())' 2>>"$log") \
  || fail_setup "'$py' cannot import torch (pass --python with the python that has torch 2.11)"
torch_dir=$(echo "$info" | sed -n 1p) torch_ver=$(echo "$info" | sed -n 2p)
say "- torch $torch_ver (CUDA $(echo "$info" | sed -n 3p), GPU visible: $(echo "$info" | sed -n 4p)) at $torch_dir; bundle built against $(cat "$work/TORCH_VERSION" 2>/dev/null)"
case $torch_ver in "$(cat "$work/TORCH_VERSION" 2>/dev/null)"*) ;; *) say "- **warning**: torch versions differ; libtorch's C++ ABI may not match" ;; esac
[ "$device" = cuda ] && command -v nvidia-smi >/dev/null && \
  say "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
. "$here/bundle_env.sh" && bundle_env "$work" "$torch_dir"
[ "$device" = cpu ] && export CUDA_VISIBLE_DEVICES=""
# diffusers for the side-by-side step, from the bundle's wheels (where this python lacks it).
if ! "$py" -c 'import diffusers' 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$work"/wheels/*.whl >>"$log" 2>&1 \
    && export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH} || say "- **warning**: diffusers wheels did not install (the step-time comparison will fail)"
fi
# ctest's gpu entries, with this bundle's paths.
if [ -f "$work/ctest/CTestTestfile.cmake.in" ]; then
  sed -e "s|@BIN@|$work/bin|g" -e "s|@MPIEXEC@|$work/mpi/bin/mpirun|g" "$work/ctest/CTestTestfile.cmake.in" >"$work/ctest/CTestTestfile.cmake"
  sed -e "s|@BIN@|$work/bin|g" -e "s|@MPIEXEC@|$work/mpi/bin/mpirun|g" "$work/ctest/commands.sh.in" >"$work/ctest/commands.sh"
fi

say ""
say "| step | verdict | seconds |"
say "| --- | --- | --- |"
failed=0 rows=""
run_step() {  # run_step NAME BUDGET_SECONDS
  local name=$1 budget=$2 t0 rc verdict secs remain
  remain=$(( $(left) - 5 ))
  if [ "$remain" -lt 15 ]; then
    say "| $name | not run: the ${limit} s limit was reached | 0 |"; failed=1; return
  fi
  [ "$budget" -le "$remain" ] || budget=$remain
  t0=$(date +%s)
  echo "===== step $name (budget ${budget} s) =====" >>"$log"
  # In the background and waited for, so that a signal to run.sh is handled at once (the trap
  # stops the step: timeout passes the signal on to the step's processes).
  timeout -k 5 "$budget" bash "$here/run.sh" --device "$device" --work "$work" --python "$py" \
      --limit "$limit" --step "$name" >>"$log" 2>&1 &
  step_pid=$!
  wait $step_pid
  rc=$?
  step_pid=""
  secs=$(( $(date +%s) - t0 ))
  case $rc in 0) verdict=pass ;; 124|137) verdict="**timed out** after ${budget} s"; failed=1 ;; *) verdict="**failed** (exit $rc)"; failed=1 ;; esac
  say "| $name | $verdict | $secs |"
  rows="$rows$name"$'\n'
  # The step's figures into the log at once (the report gets them at the end), so a run cut short
  # from outside still has them.
  [ -s "$work/notes/$name.md" ] && { echo "----- $name: figures"; cat "$work/notes/$name.md"; } >>"$log"
}

# Start the binaries; where they cannot (other system libraries), build here from the carried sources.
built=0
if [ $force_build -eq 1 ] || ! timeout -k 5 60 bash "$here/run.sh" --device "$device" --work "$work" --python "$py" \
    --step binaries >>"$log" 2>&1; then
  [ $force_build -eq 1 ] || say "| binaries | **prebuilt binaries cannot start**: $(tr '\n' ' ' <"$work/notes/binaries.md" 2>/dev/null) | - |"
  t0=$(date +%s)
  if TPRUN_GPU_PYTHON=$py timeout -k 5 $(( $(left) - 60 )) bash "$work/src/tools/gpu/fallback_build.sh" "$work" >>"$log" 2>&1; then
    say "| fallback build from the carried sources | pass | $(( $(date +%s) - t0 )) |"; built=1
  else
    say "| fallback build from the carried sources | **failed** (see gpu-check.log) | $(( $(date +%s) - t0 )) |"
    failed=1
  fi
fi
rm -f "$work/notes/binaries.md"  # the step below says it again
run_step binaries 30
run_step ctest_gpu 90
run_step nccl_np1 45
run_step mpi_np2 60
run_step parity 90
run_step generate 60
run_step job 60
run_step plan_staged 60
run_step make_checkpoint 120
run_step load 120
run_step step_time 150

say ""
say "Total $(( $(date +%s) - start )) s; binaries $([ $built -eq 1 ] && echo "built on this host" || echo prebuilt)."
say ""
for s in $rows; do
  [ -s "$work/notes/$s.md" ] || continue
  { echo "## $s"; echo; cat "$work/notes/$s.md"; echo; } >>"$report"
done
if [ $failed -eq 0 ]; then say "Verdict: every step passed."; else say "Verdict: some steps FAILED (gpu-check.log has each step's output)."; fi
exit $failed
