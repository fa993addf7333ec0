#!/usr/bin/env bash
# One device call: the benchmarks (dense decode with the pool case, sparse, compat overhead, the
# demo). Usage: bash benchmarks/gpu_session.sh [sweep]
# Logs, JSON and the demo chart go under $OUT/bench, packed into $OUT/bench.tar.gz.
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup bench
TAIL_LINES=0  # the summary at the end says what matters
run decode 200 python3 -m fp8mla.cli bench decode --out "$W/decode.json"
run sparse 150 python3 -m fp8mla.cli bench sparse --out "$W/sparse.json"
run compat 100 python3 benchmarks/compat_overhead.py "$W/compat.json"
run demo 150 python3 -m fp8mla.cli demo --out "$W/demo"
run soak 40 python3 benchmarks/soak.py "$W/soak.json" --steps 10000
run gpu_tests 300 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests -rA
if [ "${1:-}" = sweep ]; then
  run sweep 200 python3 -m fp8mla.cli bench decode --formats "${SWEEP_FORMATS:-fp8,fp8_ds_mla}" \
    --sweep --out "$W/sweep-results.json" --sweep-out "$W/sweep.json"
fi
tar -czf "$OUT/bench.tar.gz" -C "$OUT" bench
cat "$W/status.txt"; grep -h "TB/s\|x faster\|step\|%" "$W"/decode.log "$W"/compat.log | tail -30
