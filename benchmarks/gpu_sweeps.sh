#!/usr/bin/env bash
# One device call: the top-k / indexer tests on the GPU (plain, then under memcheck) and the
# sweeps behind the indexer, top-k and sparse defaults. Usage: bash benchmarks/gpu_sweeps.sh
# Logs and JSON under $OUT/sweeps, packed into $OUT/sweeps.tar.gz (the device returns ≤ 8 files).
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup sweeps
run tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_indexer_topk.py
run indexer_variants 90 python3 benchmarks/indexer_variants.py "$W/indexer_variants.json"
run profile_topk 120 python3 benchmarks/profile_topk.py "$W/profile_topk.json"
run sparse_variants 150 python3 benchmarks/sparse_variants.py "$W/sparse_variants.json"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # every tensor its own allocation: overruns show
run memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
  python3 -m pytest -q -p no:cacheprovider tests/test_indexer_topk.py
unset PYTORCH_NO_CUDA_MEMORY_CACHING
tar -czf "$OUT/sweeps.tar.gz" -C "$OUT" sweeps && cat "$W/status.txt"
