#!/usr/bin/env bash
# One device call: GPU tests, then benchmarks. Usage: bash benchmarks/gpu_session.sh [sweep]
# Writes logs and JSON under $OUT (the device tool's output folder) or ./.out.
set -uo pipefail
OUT=${OUT:-.out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest tests -q -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/pytest.log"
python3 -m fp8mla.cli bench decode --out "$OUT/results.json" 2>&1 | grep -v it/s | tee "$OUT/bench.log"
python3 -m fp8mla.cli bench sparse --out "$OUT/results-sparse.json" 2>&1 | grep -v it/s | tee "$OUT/bench-sparse.log"
if [ "${1:-}" = sweep ]; then
  python3 -m fp8mla.cli bench decode --formats "${SWEEP_FORMATS:-fp8,fp8_ds_mla}" --sweep \
    --out "$OUT/sweep-results.json" --sweep-out "$OUT/sweep.json" 2>&1 | grep -v it/s | tee "$OUT/sweep.log"
fi
