#!/usr/bin/env bash
# Runs one libFuzzer target over its seed corpus (ctest -L fuzz; tools/fuzz_checkpoint).
# usage: run_fuzzer.sh FUZZER SEED_DIR SECONDS MAX_RUNS WORK_DIR [keep]
#   MAX_RUNS     -1 for no bound
#   WORK_DIR/corpus     inputs this run found (started afresh unless "keep"; the seed
#                       folder in the source tree is only read)
#   WORK_DIR/artifacts  crashing, leaking or slow inputs, kept for the report
#   WORK_DIR/log        libFuzzer's whole output
#   FUZZ_TIMEOUT_S, FUZZ_RSS_MB (environment): the per-input limits (default 10 s, 2048 MB)
set -u
fuzzer=$1 seeds=$2 secs=$3 runs=$4 work=$5 keep=${6:-}
[ -x "$fuzzer" ] || { echo "FAIL: no fuzzer at $fuzzer (build the tprun_fuzzers target)"; exit 1; }
[ -d "$seeds" ] || { echo "FAIL: no seed corpus at $seeds"; exit 1; }
[ "$keep" = keep ] || rm -rf "$work/corpus"
mkdir -p "$work/corpus" "$work/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$fuzzer" -max_total_time="$secs" -runs="$runs" -max_len=8192 -timeout="${FUZZ_TIMEOUT_S:-10}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds" >"$work/log" 2>&1
rc=$?
grep -E '^(INFO: seed corpus|#[0-9]+[[:space:]]+(INITED|DONE))' "$work/log" | tail -n 3
grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$work/log"
if [ "$rc" -ne 0 ]; then
  echo "--- last lines of $work/log:"
  tail -n 60 "$work/log"
  echo "FAIL: $(basename "$fuzzer") exited $rc; inputs in $work/artifacts:"
  ls -l "$work/artifacts"
  exit 1
fi
echo "PASS: $(basename "$fuzzer") ($(ls "$work/corpus" | wc -l) inputs in the run's corpus)"
