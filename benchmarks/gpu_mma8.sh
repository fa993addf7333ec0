#!/usr/bin/env bash
# One device call for the ≤ 8-row Gluon kernels. Dense (`fp8mla.decode.SM90_MMA8`): every GPU
# test, the decode variants (benchmarks/decode_variants.py's PLAN), and Nsight Compute counters
# of the kernel and of the Triton kernel at B=64 × 8K × 8 heads. Sparse
# (`SPARSE_SM90_MMA8`): the sparse GPU tests, the sparse variants (sparse_variants.py's PLAN)
# and the counters of both kernels at B=64 × 8 heads × topk 2048. Dense fp8_ds_mla
# (`SM90_MMA8_DS`): the dense GPU tests (-k mma8 unless TESTS), the variants, the counters of
# both kernels at B=1 × 128K × 8 heads. The fp8 wide form (`SM90_MMA16`, 9–16 rows): every
# GPU test, the variants, the counters of the fp8_ds_mla wide form (`SM90_MMA16_DS`) and of the
# 8-row fp8_ds_mla kernel at B=64 × 8K × 16 heads. Usage:
# [TESTS=pytest -k expression] bash benchmarks/gpu_mma8.sh [sparse|ds|wide]
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
if [ "${1:-}" = sparse ]; then
  gpu_setup mma8-sparse
  run gpu_tests 200 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests/test_sparse_gpu.py -rA \
    -k "${TESTS:-not nothing}"
  run variants 240 python3 benchmarks/sparse_variants.py "$W/sparse-variants.json"
  export NCU_DRIVER=benchmarks/profile_sparse.py
  for k in 1 0; do
    run "ncu_$k" 80 bash benchmarks/ncu_decode.sh "$W/ncu-sparse-mma8$k-B64-H8.txt" 64 8 \
      SPARSE_SM90_MMA8=$k
  done
elif [ "${1:-}" = ds ]; then
  gpu_setup mma8-ds
  run gpu_tests 240 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests/test_decode_gpu.py -rA \
    -k "${TESTS:-mma8}"
  run variants 240 python3 benchmarks/decode_variants.py "$W/decode-variants.json"
  for k in 1 0; do
    run "ncu_$k" 80 bash benchmarks/ncu_decode.sh "$W/ncu-mma8-ds$k-B1-128K.txt" fp8_ds_mla 1 \
      131072 8 SM90_MMA8_DS=$k
  done
elif [ "${1:-}" = wide ]; then
  gpu_setup mma16
  run gpu_tests 300 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests -rA \
    -k "${TESTS:-not nothing}"
  run variants 200 python3 benchmarks/decode_variants.py "$W/decode-variants.json"
  for k in 1 0; do
    run "ncu_$k" 80 bash benchmarks/ncu_decode.sh "$W/ncu-mma16ds$k-B64-H16.txt" fp8_ds_mla 64 8192 \
      16 SM90_MMA16_DS=$k
  done
else
  gpu_setup mma8
  run gpu_tests 200 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests -rA \
    -k "${TESTS:-not nothing}"
  run variants 220 python3 benchmarks/decode_variants.py "$W/decode-variants.json"
  run ncu_mma8 80 bash benchmarks/ncu_decode.sh "$W/ncu-mma8-fp8-B64-H8.txt" fp8 64 8192 8 SM90_MMA8=1
  run ncu_triton 80 bash benchmarks/ncu_decode.sh "$W/ncu-triton-fp8-B64-H8.txt" fp8 64 8192 8 SM90_MMA8=0
fi
cat "$W/status.txt"; grep -h "passed\|failed\|error" "$W/gpu_tests.log" | tail -5
cat "$W/variants.log"
