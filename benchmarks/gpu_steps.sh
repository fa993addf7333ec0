#!/usr/bin/env bash
# One device call of the named steps, in order: `tests` (every GPU-marked test), `decode` /
# `sparse` (`fp8mla bench`), `compat` (benchmarks/compat_overhead.py), `variants`
# (benchmarks/decode_variants.py: its PLAN), `indexer` (its GPU tests, then
# benchmarks/indexer_variants.py), `prefill` (the dense-prefill and layer tests on the GPU, then
# benchmarks/prefill_variants.py), `packed` (the GPU tests of `fp8mla.decode.SM90_PACKED`,
# then benchmarks/decode_variants.py, whose plan A/Bs it), `fuzz` (tests/test_fuzz.py at GPU sizes: FUZZ_EXAMPLES,
# FUZZ_SCALE), `memcheck` / `racecheck` (compute-sanitizer over one test of each SM90 Gluon
# kernel, `SANITIZE_K` selects; whatever finishes inside the step's time is listed), `devices` (the launches-follow-the-tensors test: needs a
# machine of two GPUs, nvidia-h100-x2). NAME names the folder
# under $OUT (default "steps"); TRITON_TAR runs them on a packed Triton (gpu_common.sh).
# Usage: [NAME=t38] [TRITON_TAR=.t38/triton-3.8.0.tar.xz] bash benchmarks/gpu_steps.sh STEP...
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup "${NAME:-steps}" || exit
cat "$W/gpu.txt"
# a reference test of each SM90 Gluon kernel: dense TMA and paged-gather 64-row, ≤ 16-row mma
# (fp8, fp8_ds_mla), sparse 64-row and ≤ 8-head, the indexer (none has run under a sanitizer:
# the last memcheck / racecheck runs, session 11, predate them)
SANITIZE_K=${SANITIZE_K:-"sm90_gluon_kernel_matches_reference or ds_paged_kernel_matches \
or sm90_mma8_kernel_matches or sm90_mma16_kernel_matches or gluon_sparse_kernel_direct \
or entries_past_the_count or sm90_indexer_paged"}
SANITIZED="tests/test_decode_gpu.py tests/test_sparse_gpu.py tests/test_indexer_gpu.py"
for step in "$@"; do
  case $step in
    tests) run gpu_tests 300 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests -rA ;;
    decode|sparse) run "$step" 240 python3 -m fp8mla.cli bench "$step" --out "$W/$step.json" ;;
    compat) run compat 100 python3 benchmarks/compat_overhead.py "$W/compat.json" ;;
    variants) run decode_variants 200 python3 benchmarks/decode_variants.py \
      "$W/decode-variants.json" ;;
    indexer) run indexer_tests 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rA \
        tests/test_indexer_gpu.py tests/test_indexer_topk.py
      run indexer_variants 200 python3 benchmarks/indexer_variants.py \
      "$W/indexer-variants.json" ;;
    prefill) run prefill_tests 300 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -rA \
        tests/test_prefill.py tests/test_layer.py tests/test_bench_smoke.py
      run prefill_variants 250 python3 benchmarks/prefill_variants.py \
      "$W/prefill-variants.json" ;;
    packed) run packed_tests 200 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -rA -m gpu \
        tests/test_decode_gpu.py -k "packed or blind_query_rows or pool_off"
      run decode_variants 300 python3 benchmarks/decode_variants.py "$W/decode-variants.json" ;;
    fuzz) FP8MLA_FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-30} FP8MLA_FUZZ_SCALE=${FUZZ_SCALE:-4} \
      run fuzz 240 python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py \
      --hypothesis-show-statistics ;;
    memcheck) PYTORCH_NO_CUDA_MEMORY_CACHING=1 run memcheck 290 compute-sanitizer \
        --tool memcheck --error-exitcode 9 --print-limit 20 python3 -m pytest -q \
        -p no:cacheprovider -rA -m gpu $SANITIZED -k "$SANITIZE_K" ;;
    racecheck) run racecheck 290 compute-sanitizer --tool racecheck --error-exitcode 9 \
        --print-limit 20 python3 -m pytest -q -p no:cacheprovider -rA -m gpu $SANITIZED \
        -k "$SANITIZE_K" ;;
    devices) run devices 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rA \
        tests/test_launch_gpu.py -k tensors_device ;;
    *) echo "unknown step: $step"; exit 2 ;;
  esac
done
cat "$W/status.txt"
