#!/usr/bin/env bash
# Hostile checkpoints given to `tprun inspect`: a clean refusal, never a crash or a hang.
# usage: hostile_cli.sh MODE TPRUN [MPIRUN]
#   single  each case in one process: exit 4 (checkpoint error), exactly one error line,
#           naming the file (and the tensor or config field, where there is one), no signal,
#           within 30 s; a hostile config.json (config_*) within 3 s more CPU time (user +
#           system: waiting for a core on a busy machine does not count) and 64 MB more peak
#           memory than inspecting a valid file
#   mpi     under `mpirun --oversubscribe -np 2`: every rank exits non-zero (4, or torn
#           down by an MPI_Abort that mpirun reports), no signal, within 60 s. One case of
#           each kind (an mpirun start costs seconds); TPRUN_HOSTILE_ALL=1 runs them all.
# The cases are written by tests/fuzz/make_hostile.py (the unit tests in
# tests/unit/test_safetensors.cpp and the fuzz corpus hold the same ones).
set -u
mode=$1 tprun=$2 mpirun=${3:-mpirun}
[[ $tprun == */* ]] && tprun=$(realpath "$tprun")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
python3 "$here/../fuzz/make_hostile.py" cli "$work/cases" || { echo "FAIL: the case generator failed"; exit 1; }
failures=0 name=setup
fail() {
  echo "FAIL [$name]: $*"
  sed 's/^/    | /' "$work/out" | head -n 20
  failures=$((failures + 1))
}
# run LIMIT_S CMD...: sets $rc, $secs (wall), $cpu (user + system seconds) and $rss_kb (peak);
# a run past the limit is a hang.
run() {
  local limit=$1 user sys; shift
  /usr/bin/time -o "$work/usage" -f '%e %M %U %S' timeout -k 5 "$limit" "$@" </dev/null >"$work/out" 2>&1; rc=$?
  # GNU time passes the exit status on; its last line is "SECONDS MAXRSS_KB USER SYS".
  read -r secs rss_kb user sys < <(tail -n 1 "$work/usage") || { secs=0 rss_kb=0 user=0 sys=0; }
  cpu=$(awk "BEGIN{print ${user:-0} + ${sys:-0}}")
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then fail "hung: still running after ${limit}s"; return 1; fi
  return 0
}
crashed() {
  grep -aqE 'Segmentation fault|core dumped|Aborted|Bus error|signal (4|6|7|8|11)|AddressSanitizer|runtime error:|terminate called|internal error' "$work/out"
}

# The good files first: without them the refusals below would prove nothing.
name=valid
run 30 "$tprun" inspect "$work/cases/valid.safetensors" && { [ "$rc" -eq 0 ] || fail "a valid file: exit $rc"; }
base_cpu=$cpu base_rss_kb=$rss_kb
name=variant_plain
run 30 "$tprun" inspect "$work/cases/variant_fp16_truncated" && { [ "$rc" -eq 0 ] || fail "plain weights beside a bad fp16 variant: exit $rc"; }

total=0
mpi_cases="truncated_body huge_header_length header_not_json duplicate_tensor overlapping_offsets
  shape_wraps_128_bits deeply_nested_shape folder_truncated_body index_missing_shard index_orphan_shard
  pickle_folder variant_fp16_truncated json_tp2_truncated config_t5_layers_2e9"
mpi_cases=$(echo $mpi_cases)
while IFS=$'\t' read -r name path needle args; do
  total=$((total + 1))
  extra=()
  [ "$args" = "-" ] || read -r -a extra <<<"$args"
  case $mode in
  single)
    run 30 "$tprun" inspect "$path" "${extra[@]}" || continue
    crashed && { fail "crashed"; continue; }
    [ "$rc" -eq 4 ] || { fail "exit $rc, expected 4 (checkpoint error)"; continue; }
    n=$(grep -aci 'error' "$work/out")
    [ "$n" -eq 1 ] || { fail "expected one error line, got $n"; continue; }
    line=$(grep -ai 'error' "$work/out")
    case $line in *"checkpoint error"*) ;; *) fail "not reported as a checkpoint error"; continue ;; esac
    grep -aqF -- "$path" <<<"$line" || { fail "the error does not name $path"; continue; }
    if [ "$needle" != "-" ]; then
      grep -aqF -- "$needle" <<<"$line" || { fail "the error does not name '$needle'"; continue; }
    fi
    if [[ $name == config_* ]]; then
      # CPU time, not wall time: a hostile config must not make tprun compute (parse, allocate)
      # for long, and on a busy machine the wall time of a ~1 s run varies by seconds.
      awk "BEGIN{exit !($cpu <= $base_cpu + 3)}" || { fail "took ${cpu} s of CPU (a valid file: ${base_cpu} s)"; continue; }
      [ "$rss_kb" -le $((base_rss_kb + 65536)) ] || { fail "peak RSS ${rss_kb} kB (a valid file: ${base_rss_kb} kB)"; continue; }
    fi
    ;;
  mpi)
    if [ "${TPRUN_HOSTILE_ALL:-0}" != 1 ]; then
      case " $mpi_cases " in *" $name "*) ;; *) total=$((total - 1)); continue ;; esac
    fi
    # Each rank reports its own exit status; a rank torn down by MPI_Abort cannot, so
    # then mpirun must say so. mpirun waits for every rank (orte_abort_on_non_zero_status 0):
    # by default it kills the others once one exits non-zero, and on a busy machine a slower
    # rank could then be killed between its error and its report.
    run 60 "$mpirun" --oversubscribe --mca orte_abort_on_non_zero_status 0 -np 2 bash -c \
      '"$0" inspect "$@"; rc=$?; echo "hostile-rank ${OMPI_COMM_WORLD_RANK:-?} exit $rc"; exit $rc' \
      "$tprun" "$path" "${extra[@]}" || continue
    crashed && { fail "crashed"; continue; }
    # (mpirun itself exits 0 when no rank aborted: the ranks' own reports are the verdict.)
    if grep -aq 'MPI_ABORT' "$work/out"; then [ "$rc" -ne 0 ] || { fail "mpirun exited 0 after an MPI_Abort"; continue; }; fi
    grep -aqE '^hostile-rank [0-9?]+ exit 0$' "$work/out" && { fail "a rank exited 0"; continue; }
    for r in 0 1; do
      if ! grep -aqE "^hostile-rank $r exit [1-9][0-9]*$" "$work/out" && ! grep -aq 'MPI_ABORT' "$work/out"; then
        fail "rank $r neither exited non-zero nor was aborted"; continue 2
      fi
    done
    n=$(grep -ac 'checkpoint error' "$work/out")
    [ "$n" -ge 1 ] && [ "$n" -le 2 ] || { fail "expected one checkpoint error line per rank at most, got $n"; continue; }
    grep -a 'checkpoint error' "$work/out" | grep -aqF -- "$path" || { fail "the error does not name $path"; continue; }
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
  esac
done <"$work/cases/cases.tsv"

[ "$total" -ge 14 ] || { echo "FAIL: only $total cases ran"; exit 1; }
if [ "$failures" -ne 0 ]; then echo "FAIL: $failures failed checks over $total hostile cases and 2 valid ones ($mode)"; exit 1; fi
echo "PASS: $total hostile cases ($mode)"
