#!/usr/bin/env bash
# One device call: the benchmarks (dense decode with the pool case, sparse, compat overhead, the
# demo). Usage: bash benchmarks/gpu_session.sh [sweep]
# Logs, JSON and the demo chart go under $OUT/bench, packed into $OUT/bench.tar.gz.
set -uo pipefail
OUT=${OUT:-.out}; W=$OUT/bench; mkdir -p "$W"
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$W/gpu.txt"
run() {  # name timeout command...: log to $W/name.log, exit status to $W/status.txt
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" 2>&1 | grep -v "it/s]" > "$W/$name.log"
  echo "$name rc=${PIPESTATUS[0]} seconds=$((SECONDS - t0))" | tee -a "$W/status.txt"
}
run decode 200 python3 -m fp8mla.cli bench decode --out "$W/decode.json"
run sparse 150 python3 -m fp8mla.cli bench sparse --out "$W/sparse.json"
run compat 100 python3 benchmarks/compat_overhead.py "$W/compat.json"
run demo 150 python3 -m fp8mla.cli demo --out "$W/demo"
run soak 40 python3 benchmarks/soak.py "$W/soak.json" --steps 10000
run gpu_tests 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests -rA
if [ "${1:-}" = sweep ]; then
  run sweep 200 python3 -m fp8mla.cli bench decode --formats "${SWEEP_FORMATS:-fp8,fp8_ds_mla}" \
    --sweep --out "$W/sweep-results.json" --sweep-out "$W/sweep.json"
fi
tar -czf "$OUT/bench.tar.gz" -C "$OUT" bench
cat "$W/status.txt"; grep -h "TB/s\|x faster\|step\|%" "$W"/decode.log "$W"/compat.log | tail -30
