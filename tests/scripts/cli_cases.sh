#!/usr/bin/env bash
# Command-line and failure cases of tprun under mpirun, one per ctest entry.
# usage: cli_cases.sh CASE TPRUN FAULT_PROBE MPIRUN
set -u
case_name=$1 tprun=$2 probe=$3 mpirun=$4
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
mpi=("$mpirun" --oversubscribe)
fail() { echo "FAIL [$case_name]: $*"; echo "--- output:"; cat "$work/out" 2>/dev/null; exit 1; }

# run LIMIT_S CMD...: runs with a hard time limit, sets $rc and $secs.
run() {
  local limit=$1; shift
  local t0=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >"$work/out" 2>&1; rc=$?
  secs=$(echo "$(date +%s.%N) - $t0" | bc)
  # timeout(1) answers 124 (or 137 after -k); mpirun itself answers 137 for a
  # rank killed by SIGKILL, so the elapsed time decides.
  if [ "$rc" -eq 124 ] || awk "BEGIN{exit !($secs >= $limit)}"; then fail "hung: still running after ${limit}s"; fi
  return 0
}
count() { grep -c -- "$1" "$work/out" || true; }

case $case_name in
env_tp2)
  run 60 "${mpi[@]}" -np 4 "$tprun" env --tp 2
  [ "$rc" -eq 0 ] || fail "exit $rc"
  [ "$(count '^rank ')" -eq 4 ] || fail "expected 4 rank lines"
  for r in 0 1 2 3; do grep -q "^rank $r/4 " out || fail "rank $r missing or out of order"; done
  [ "$(grep '^rank ' out | head -1 | cut -d' ' -f2)" = "0/4" ] || fail "not in rank order"
  grep -q '^rank 1/4 .* dp=0/2 tp=1/2 tp_group=\[0,1\] dp_peers=\[1,3\]' out || fail "rank 1 mesh line"
  grep -q '^rank 2/4 .* dp=1/2 tp=0/2 tp_group=\[2,3\] dp_peers=\[0,2\]' out || fail "rank 2 mesh line"
  grep -q 'env=OMPI_COMM_WORLD_\*' out || fail "environment source not shown"
  grep -q 'device=cpu threads=1' out || fail "4 CPU ranks on this host should get 1 thread each"
  [ -f logs/rank-0003.log ] || fail "per-rank log file missing"
  grep -q '\[r3/4\]' logs/rank-0003.log || fail "rank prefix missing in rank 3's log"
  ;;
env_tp3_fails)
  run 60 "${mpi[@]}" -np 4 "$tprun" env --tp 3
  [ "$rc" -ne 0 ] || fail "expected a non-zero exit"
  n=$(count 'world 4 is not divisible by tp 3')
  [ "$n" -eq 4 ] || fail "expected the message from all 4 ranks, got $n"
  grep -q 'MPI_ABORT' out && fail "a clean, identical error on every rank must not MPI_Abort"
  [ "$(count '^rank ')" -eq 0 ] || fail "printed mesh lines despite the error"
  ;;
env_usage_errors)
  run 30 "${mpi[@]}" -np 2 "$tprun" env --tp x
  [ "$rc" -ne 0 ] || fail "bad value accepted"
  [ "$(count "option '--tp' is invalid")" -eq 1 ] || fail "bad value: expected one line naming --tp"
  run 30 "${mpi[@]}" -np 2 "$tprun" env --bogus
  [ "$rc" -ne 0 ] || fail "unknown option accepted"
  [ "$(count "unrecognised option '--bogus'")" -eq 1 ] || fail "unknown option not named once"
  run 30 "$tprun" nosuchcmd
  [ "$rc" -eq 2 ] || fail "unknown command: exit $rc"
  grep -q "unknown command 'nosuchcmd'" out || fail "unknown command not named"
  run 30 "$tprun" --help
  [ "$rc" -eq 0 ] && grep -q '^  env ' out && grep -q '^  bench ' out || fail "--help lists commands"
  run 30 "$tprun" env --help
  [ "$rc" -eq 0 ] && grep -q -- '--tp' out && grep -q -- '--device' out || fail "env --help"
  run 30 "$tprun" env --log-level loud
  [ "$rc" -ne 0 ] && grep -q "log-level 'loud'" out || fail "bad log level not named"
  ;;
throw_aborts)
  run 30 "${mpi[@]}" -np 4 "$probe" throw 1
  [ "$rc" -ne 0 ] || fail "job exited 0"
  awk "BEGIN{exit !($secs < 10)}" || fail "took ${secs}s (limit 10s)"
  grep -q '\[r1/4\].*planted failure' out || fail "error not logged with its rank"
  ;;
signal_aborts)
  run 30 "${mpi[@]}" -np 4 "$probe" signal 2
  [ "$rc" -ne 0 ] || fail "job exited 0"
  grep -q 'rank 2 .*signal 9' out || fail "mpirun did not report rank 2's signal"
  awk "BEGIN{exit !($secs < 10)}" || fail "took ${secs}s (limit 10s)"
  ;;
hang_times_out)
  run 40 "${mpi[@]}" -np 3 "$probe" hang 2 2
  [ "$rc" -ne 0 ] || fail "job exited 0"
  awk "BEGIN{exit !($secs < 15)}" || fail "took ${secs}s"
  grep -q 'did not complete within 2 s' out || fail "watchdog message missing"
  ;;
env_sources)
  # One process, no launcher: MPI itself. torchrun variables that disagree with MPI: an error.
  run 30 env -u OMPI_COMM_WORLD_RANK "$tprun" env --log-dir ''
  [ "$rc" -eq 0 ] || fail "singleton: exit $rc"
  grep -q '^rank 0/1 .*env=MPI' out || fail "singleton should report env=MPI"
  run 30 env RANK=0 WORLD_SIZE=2 "$tprun" env --log-dir ''
  [ "$rc" -ne 0 ] || fail "stale torchrun variables accepted"
  grep -q 'RANK/WORLD_SIZE says rank 0 of 2, but MPI sees rank 0 of 1' out || fail "mismatch message"
  run 30 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$tprun" env --log-dir '' --threads 1
  [ "$rc" -eq 0 ] && grep -q 'env=RANK/WORLD_SIZE' out && grep -q 'threads=1' out || fail "torchrun variables"
  ;;
set_messages)
  # Errors before the session starts (a bad --set) carry the rank prefix, and no colour
  # escape codes reach output that is not a terminal; --set names the flag and the full key.
  printf 'model = "%s/none"\nrequests = "%s/r.jsonl"\n' "$work" "$work" >job.toml
  run 60 "${mpi[@]}" -np 2 "$tprun" run job.toml --set nodot
  [ "$rc" -ne 0 ] || fail "--set nodot accepted"
  grep -q $'\x1b\[' out && fail "colour escape codes in non-terminal output"
  for r in 0 1; do
    grep -q "\[r$r/2\] \[error\] .*--set 'nodot': expected KEY=VALUE" out || fail "rank $r: no prefixed --set error"
  done
  grep -q 'MPI_ABORT' out && fail "a clean, identical error on every rank must not MPI_Abort"
  run 60 "${mpi[@]}" -np 2 "$tprun" run job.toml --set a.b.c.d=1
  [ "$rc" -ne 0 ] || fail "--set a.b.c.d=1 accepted"
  grep -q $'\x1b\[' out && fail "colour escape codes in non-terminal output"
  [ "$(count '\[r[01]/2\] \[error\] .*--set a\.b\.c\.d: unknown key')" -eq 2 ] || fail "--set and the full key not named by both ranks"
  grep -q 'job.toml:0' out && fail "a key the flag made is reported at line 0 of the file"
  ;;
nul_prompt)
  # A NUL in a prompt: the request is refused (the PNG metadata could not carry it); a
  # non-ASCII prompt round-trips into the PNG's text exactly.
  timeout 120 "$tprun" init-model model --arch flux --preset tiny >/dev/null 2>&1 || fail "init-model"
  printf 'model = "%s/model"\nrequests = "%s/r.jsonl"\n[defaults]\nheight = 32\nwidth = 32\nsteps = 1\nseed = 3\n[output]\ndir = "%s/o"\n' \
    "$work" "$work" "$work" >job.toml
  printf '%s\n' '{"id": "nul", "prompt": "left\u0000right"}' '{"id": "neg", "prompt": "a", "negative_prompt": "b\u0000c", "true_cfg_scale": 2}' \
    '{"id": "ok", "prompt": "caf\u00e9 \u2615 left right"}' >r.jsonl
  run 120 "${mpi[@]}" -np 1 "$tprun" run job.toml --progress none
  [ "$rc" -eq 6 ] || fail "exit $rc, expected 6 (some requests failed)"
  python3 - "$work/o" <<'PY' >>out 2>&1 || fail "results or PNG text"
import json, os, struct, sys, zlib
out = sys.argv[1]
recs = {r["id"]: r for r in map(json.loads, open(os.path.join(out, "results.jsonl")))}
for rid, field in (("nul", "prompt"), ("neg", "negative_prompt")):
    r = recs[rid]
    assert r["status"] == "failed" and f"{field} holds a NUL character" in r["error"], r
pngs = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.endswith(".png")]
assert len(pngs) == 1, pngs
data, pos, text = open(pngs[0], "rb").read(), 8, {}
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b"tEXt":
        k, v = body.split(b"\0", 1)
        text[k.decode()] = v.decode("latin-1")
    elif kind == b"iTXt":
        k, rest = body.split(b"\0", 1)
        rest = rest[2:]                      # compression flag and method
        rest = rest.split(b"\0", 2)[2]       # language tag, translated keyword
        text[k.decode()] = rest.decode("utf-8")
assert text.get("prompt") == "caf\u00e9 \u2615 left right", text
print("PNG text round-trips:", text["prompt"])
PY
  ;;
init_model_wan)
  # `init-model --arch wan | wan-a14b`: listed in --help; a bad preset or architecture refused with
  # exit 3 on every rank, naming what is known, and no folder (nor its temporary) left behind.
  run 60 "$tprun" init-model --help
  grep -q 'wan (Wan 2.1 text to video, WanPipeline)' out || fail "--help does not list --arch wan"
  grep -q 'wan-a14b (Wan 2.2 A14B, WanPipeline with two' out || fail "--help does not list --arch wan-a14b"
  for arch in wan wan-a14b; do
    run 60 "${mpi[@]}" -np 2 "$tprun" init-model "$work/m-$arch" --arch $arch --preset huge
    [ "$rc" -eq 3 ] || fail "--arch $arch --preset huge: exit $rc, expected 3"
    [ "$(count "\[r[01]/2\] \[error\] config error: unknown preset 'huge'; choose one of: tiny, small")" -eq 2 ] ||
      fail "--arch $arch --preset huge: not refused by both ranks naming tiny and small"
    ls -d "$work"/m-* >/dev/null 2>&1 && fail "--arch $arch: a refused preset left a folder"
  done
  run 60 "$tprun" init-model "$work/m" --arch wan2.1
  [ "$rc" -eq 3 ] || fail "--arch wan2.1: exit $rc, expected 3"
  grep -q "'wan2.1' is not known (.*wan, wan-a14b" out || fail "--arch wan2.1: the known archs not named"
  ;;
*) echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
