#!/usr/bin/env bash
# One device call: the sweeps behind the kernels' defaults (decode, indexer, top-k, sparse) and
# the top-k / indexer tests on the GPU (plain, then under memcheck).
# Usage: bash benchmarks/gpu_sweeps.sh [STEP...]   STEP: tests decode indexer topk sparse memcheck
# (default: all; together they need more than one 10-minute call). Logs and JSON under
# $OUT/sweeps, packed into $OUT/sweeps.tar.gz (the device returns ≤ 8 files).
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup sweeps
STEPS=" ${*:-tests decode indexer topk sparse memcheck} "
want() { [[ $STEPS == *" $1 "* ]]; }
want tests && run tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_indexer_topk.py
want decode && run decode_variants 240 python3 benchmarks/decode_variants.py "$W/decode_variants.json"
want indexer && run indexer_variants 90 python3 benchmarks/indexer_variants.py "$W/indexer_variants.json"
want topk && run profile_topk 120 python3 benchmarks/profile_topk.py "$W/profile_topk.json"
want sparse && run sparse_variants 150 python3 benchmarks/sparse_variants.py "$W/sparse_variants.json"
if want memcheck; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # every tensor its own allocation: overruns show
  run memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/test_indexer_topk.py
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
fi
tar -czf "$OUT/sweeps.tar.gz" -C "$OUT" sweeps && cat "$W/status.txt"
