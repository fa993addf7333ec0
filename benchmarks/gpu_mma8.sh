#!/usr/bin/env bash
# One device call for the ≤ 8-row Gluon kernel (`fp8mla.decode.SM90_MMA8`): the dense GPU tests
# (its own forced on), the decode variants' A/B, and Nsight Compute counters of it and of the
# Triton kernel at B=64 × 8K × 8 heads. Usage: [TESTS=pytest -k expression] bash
# benchmarks/gpu_mma8.sh (with TESTS: those tests, and the kernel's counters at B=1 × 128K)
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup mma8
run gpu_tests 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_gpu.py -rA -x \
  -k "${TESTS:-not nothing}"
run variants 220 python3 benchmarks/decode_variants.py "$W/decode-variants.json"
run ncu_mma8 80 bash benchmarks/ncu_decode.sh "$W/ncu-mma8-fp8-B64-H8.txt" fp8 64 8192 8 SM90_MMA8=1
if [ -z "${TESTS:-}" ]; then
  run ncu_triton 80 bash benchmarks/ncu_decode.sh "$W/ncu-triton-fp8-B64-H8.txt" fp8 64 8192 8 SM90_MMA8=0
else
  run ncu_mma8_b1 80 bash benchmarks/ncu_decode.sh "$W/ncu-mma8-fp8-B1-H8.txt" fp8 1 131072 8 SM90_MMA8=1
fi
cat "$W/status.txt"; grep -h "passed\|failed\|error" "$W/gpu_tests.log" | tail -5
cat "$W/variants.log"
