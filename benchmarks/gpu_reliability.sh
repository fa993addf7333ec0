#!/usr/bin/env bash
# One device call: the GPU test suite, GPU-sized fuzzing, the CUDA-graph soak, and
# compute-sanitizer (memcheck over the kernel tests, racecheck over decode). Usage:
#   bash benchmarks/gpu_reliability.sh            (logs and JSON under $OUT, packed in one tar)
#   SUITE=0 SOAK=0 bash benchmarks/gpu_reliability.sh   (fuzz + sanitizers only: one device call)
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup reliability
if [ "${SUITE:-1}" = 1 ]; then  # the whole suite on the GPU (SUITE=0 skips it: ~8-10 min)
  run pytest 240 python3 -m pytest tests -q -p no:cacheprovider --deselect tests/test_portability.py
fi
# fuzzing at GPU sizes: FUZZ_SCALE multiplies the CPU bounds (4: lengths to 600, heads to 80,
# top-k to 320, rows to 12000); the statistics record the examples tried per kernel
FP8MLA_FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-30} FP8MLA_FUZZ_SCALE=${FUZZ_SCALE:-4} \
  run fuzz 180 python3 -m pytest tests/test_fuzz.py -q -p no:cacheprovider --hypothesis-show-statistics
if [ "${SOAK:-1}" = 1 ]; then run soak 120 python3 benchmarks/soak.py "$W/soak.json" --steps 10000; fi
export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # every tensor its own allocation: memcheck sees overruns
run memcheck ${MEMCHECK_TIMEOUT:-330} compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
  python3 -m pytest -q -p no:cacheprovider tests/test_decode.py tests/test_sparse.py \
  tests/test_indexer_topk.py tests/test_formats_cache.py tests/test_compat.py
run racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 --print-limit 20 \
  python3 -m pytest -q -p no:cacheprovider tests/test_decode.py -k "matches_reference"
unset PYTORCH_NO_CUDA_MEMORY_CACHING
if [ -n "${VARIANTS:-}" ]; then run variants 120 python3 benchmarks/decode_variants.py "$W/variants.json"; fi
tar -czf "$OUT/reliability.tar.gz" -C "$OUT" reliability && cat "$W/status.txt"
