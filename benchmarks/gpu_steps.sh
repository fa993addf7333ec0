#!/usr/bin/env bash
# One device call of the named steps, in order: `tests` (every GPU-marked test), `decode` /
# `sparse` (`fp8mla bench`), `compat` (benchmarks/compat_overhead.py), `variants`
# (benchmarks/decode_variants.py: its PLAN), `indexer` (its GPU tests, then
# benchmarks/indexer_variants.py), `prefill` (the dense-prefill and layer tests on the GPU, then
# benchmarks/prefill_variants.py), `devices` (the launches-follow-the-tensors test: needs a
# machine of two GPUs, nvidia-h100-x2). NAME names the folder
# under $OUT (default "steps"); TRITON_TAR runs them on a packed Triton (gpu_common.sh).
# Usage: [NAME=t38] [TRITON_TAR=.t38/triton-3.8.0.tar.xz] bash benchmarks/gpu_steps.sh STEP...
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup "${NAME:-steps}" || exit
cat "$W/gpu.txt"
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
    devices) run devices 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rA \
        tests/test_launch_gpu.py -k tensors_device ;;
    *) echo "unknown step: $step"; exit 2 ;;
  esac
done
cat "$W/status.txt"
