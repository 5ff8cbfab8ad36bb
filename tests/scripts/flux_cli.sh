#!/usr/bin/env bash
# `tprun forward` and `tprun verify` on the diffusers reference Flux transformer
# (tests/data/flux_transformer), under mpirun; one case per ctest entry.
# usage: flux_cli.sh CASE TPRUN MPIRUN [PYTHON]   (PYTHON with safetensors+torch
# compares outputs with the reference; without it those comparisons are skipped)
set -u
case_name=$1 tprun=$2 mpirun=$3 python=${4:-}
data=${TPRUN_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/data/flux_transformer
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
mpi=("$mpirun" --oversubscribe)
fail() { echo "FAIL [$case_name]: $*"; echo "--- output:"; cat "$work/out" 2>/dev/null; exit 1; }
run() { timeout -k 5 120 "$@" >"$work/out" 2>&1; rc=$?; [ "$rc" -ne 124 ] || fail "hung"; }
compare() {  # compare OUT.safetensors: max abs diff of sample vs expected <= 1e-4
  [ -n "$python" ] || { echo "(no python: comparison of $1 skipped)"; return 0; }
  "$python" - "$1" "$data/expected.safetensors" <<'PY' >>"$work/out" 2>&1 || fail "sample differs from diffusers"
import sys
from safetensors.torch import load_file
o, e = load_file(sys.argv[1])["sample"], load_file(sys.argv[2])["sample"]
d = (o - e).abs().max().item()
print(f"{sys.argv[1]}: max abs diff vs diffusers {d:.3g}")
sys.exit(0 if o.shape == e.shape and d <= 1e-4 else 1)
PY
}
[ -d "$data/model" ] || { echo "reference data missing"; exit 0; }

case $case_name in
forward)
  for np in 1 2 4; do
    run "${mpi[@]}" -np "$np" "$tprun" forward --model "$data/model" --inputs "$data/inputs.safetensors" \
        --out "out$np.safetensors" --tp "$np" --log-dir ''
    [ "$rc" -eq 0 ] || fail "np $np: exit $rc"
    compare "out$np.safetensors"
  done
  grep -q "all_reduce 6 calls" out || fail "tp 4: expected 6 all_reduce calls"
  # HDF5 checkpoint, dp 2 x tp 2.
  run "$tprun" convert "$data/model" flux.h5 --tp-chunks 4
  [ "$rc" -eq 0 ] || fail "convert: exit $rc"
  run "${mpi[@]}" -np 4 "$tprun" forward --model flux.h5 --inputs "$data/inputs.safetensors" --out h5.safetensors \
      --tp 2 --log-dir ''
  [ "$rc" -eq 0 ] || fail "h5: exit $rc"
  compare h5.safetensors
  ;;
verify)
  run "${mpi[@]}" -np 2 "$tprun" verify --model "$data/model" --tp 2 --log-dir ''
  [ "$rc" -eq 0 ] || fail "exit $rc"
  grep -q "^OK: max abs diff" out || fail "no OK line"
  grep -q "all_reduce calls per forward: 6 (plan: 6)" out || fail "collective count"
  grep -q "^single_transformer_blocks.1.hidden_states " out || fail "per-block line missing"
  run "${mpi[@]}" -np 4 "$tprun" verify --model "$data/model_single" --tp 4 --inputs "$data/inputs.safetensors" \
      --shard-modulation --log-dir ''
  [ "$rc" -eq 0 ] || fail "shard-modulation: exit $rc"
  grep -q "all_reduce calls per forward: 7 (plan: 7)" out || fail "shard-modulation collective count"
  for dt in bf16 fp16; do  # default tolerances 5e-2 / 1e-2
    run "${mpi[@]}" -np 4 "$tprun" verify --model "$data/model" --tp 4 --dtype "$dt" --log-dir ''
    [ "$rc" -eq 0 ] || fail "$dt: exit $rc"
  done
  ;;
verify_beyond_tolerance)
  run "${mpi[@]}" -np 2 "$tprun" verify --model "$data/model" --tp 2 --tolerance 1e-12 --log-dir ''
  [ "$rc" -eq 1 ] || fail "expected exit 1, got $rc"
  grep -q "^FAIL: max abs diff" out || fail "no FAIL line"
  ;;
tp3_refused)
  run "${mpi[@]}" -np 3 "$tprun" forward --model "$data/model" --inputs "$data/inputs.safetensors" --out x.safetensors \
      --tp 3 --log-dir ''
  [ "$rc" -eq 3 ] || fail "expected exit 3 (config), got $rc"
  grep -q "tp 3 does not divide num_attention_heads 4" out || fail "message"
  [ ! -e x.safetensors ] || fail "output written"
  ;;
unknown_class)
  # A component or pipeline class tprun has no family for: one clear error on every rank, naming the
  # class and the known ones; a replicated component has nothing to verify.
  mkdir comp && cp "$data/model_single/"* comp/
  sed -i 's/"FluxTransformer2DModel"/"SD3Transformer2DModel"/' comp/config.json
  run "${mpi[@]}" -np 2 "$tprun" forward --model comp --inputs "$data/inputs.safetensors" --out x.safetensors --log-dir ''
  [ "$rc" -eq 3 ] || fail "forward: expected exit 3 (config), got $rc"
  [ "$(grep -c "class 'SD3Transformer2DModel' is not a model tprun can run (known: .*FluxTransformer2DModel" out)" -eq 2 ] ||
      fail "forward: the message on both ranks"
  pipe=${data%/flux_transformer}/flux_pipeline/model
  cp -r "$pipe" pipe
  sed -i 's/"FluxPipeline"/"StableDiffusion3Pipeline"/' pipe/model_index.json
  run "${mpi[@]}" -np 2 "$tprun" generate --model pipe --prompt x --out x.png --log-dir ''
  [ "$rc" -eq 3 ] || fail "generate: expected exit 3 (config), got $rc"
  grep -q "_class_name 'StableDiffusion3Pipeline' is not a pipeline tprun can run (known: .*FluxPipeline" out ||
      fail "generate: message"
  run "${mpi[@]}" -np 2 "$tprun" verify --model "$pipe" --component vae_decoder --tp 2 --log-dir ''
  [ "$rc" -eq 3 ] || fail "verify vae: expected exit 3, got $rc"
  grep -q "AutoencoderKL has no TP plan" out || fail "verify vae: message"
  [ ! -e x.safetensors ] && [ ! -e x.png ] || fail "output written"
  ;;
*) echo "unknown case $case_name"; exit 2 ;;
esac
echo "ok [$case_name]"
