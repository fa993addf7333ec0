#!/usr/bin/env bash
# One device call for prepared A/Bs: the GPU tests a pytest -k expression names (TESTS; none
# where unset), then `benchmarks/flush_ab.py` for each PLAN given (its `PLANS`' names), each
# case checked against the reference before it is timed. Usage:
#   [TESTS="in_order"] bash benchmarks/gpu_ab.sh [PLAN ...]
# Logs, status and JSON under $OUT/ab.
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup ab
if [ -n "${TESTS:-}" ]; then
  run gpu_tests 240 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu tests -rA \
    -k "$TESTS"
fi
for plan in "$@"; do
  run "flush-$plan" 300 python3 benchmarks/flush_ab.py "$W/$plan-flush-ab.json" "$plan"
done
cat "$W/status.txt"
