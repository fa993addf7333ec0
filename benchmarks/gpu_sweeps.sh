#!/usr/bin/env bash
# One device call: the sweeps behind the kernels' defaults (decode, indexer, top-k, sparse) and
# the top-k / indexer tests on the GPU (plain, then under memcheck).
# Usage: bash benchmarks/gpu_sweeps.sh [STEP...]   STEP: tests decode indexer topk sparse memcheck
# (default: all — about 13 minutes at the steps' time limits, more than one 10-minute call, so
# name the steps). Logs and JSON under $OUT/sweeps, packed into $OUT/sweeps.tar.gz after every
# step (the device returns ≤ 8 files; a call cut short keeps the steps that finished).
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
ALL="tests decode indexer topk sparse memcheck"
for s in "$@"; do
  [[ " $ALL " == *" $s "* ]] || { echo "unknown step '$s' (expected some of: $ALL)" >&2; exit 2; }
done
gpu_setup sweeps
STEPS=" ${*:-$ALL} "
want() { [[ $STEPS == *" $1 "* ]]; }
pack() { tar -czf "$OUT/sweeps.tar.gz" -C "$OUT" sweeps; }
want tests && run tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_indexer_topk.py && pack
want decode && run decode_variants 240 python3 benchmarks/decode_variants.py "$W/decode_variants.json" && pack
want indexer && run indexer_variants 90 python3 benchmarks/indexer_variants.py "$W/indexer_variants.json" && pack
want topk && run profile_topk 120 python3 benchmarks/profile_topk.py "$W/profile_topk.json" && pack
want topk && run topk_variants 90 python3 benchmarks/topk_variants.py "$W/topk_variants.json" && pack
want sparse && run sparse_variants 150 python3 benchmarks/sparse_variants.py "$W/sparse_variants.json" && pack
if want memcheck; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # every tensor its own allocation: overruns show
  run memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/test_indexer_topk.py
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
fi
pack && cat "$W/status.txt"
