#!/usr/bin/env bash
# One device call for the two-group decode kernel (`fp8mla.kernels.decode_sm90_pair`, switched
# on by `SM90_MMA8_PAIR` / `SM90_MMA16_PAIR`): its GPU tests and the timeline stamps' under the
# tests' watchdog (a hung kernel ends its test after FP8MLA_GPU_TEST_TIMEOUT s, 120 here, with
# its stack), then — only if they pass — `flush_ab.py`'s default A/B (both forms against two
# programs an SM, eight cases, do_bench's flush and a clean L2); with TIMELINE=1 also `timeline.py` (each program's —
# each group's — phases, both kernels; ~2 min more). Set FP8MLA_COMMIT (the device copy has no
# history). Usage: [TIMELINE=1] bash benchmarks/gpu_pair.sh
set -uo pipefail
. "$(dirname "$0")/gpu_common.sh"
gpu_setup pair
export PYTHONPATH=$PYTHONPATH:$PWD/benchmarks FP8MLA_GPU_TEST_TIMEOUT=${FP8MLA_GPU_TEST_TIMEOUT:-120}
TAIL_LINES=6 run gpu_tests 280 python3 -m pytest -q -p no:cacheprovider $PYTEST_N -m gpu \
  tests/test_decode_gpu.py -rA -k "pair or timeline"
if grep -q "gpu_tests rc=0" "$W/status.txt"; then
  TAIL_LINES=20 run flush_ab 280 python3 benchmarks/flush_ab.py "$W/pair-flush-ab.json"
  if [ "${TIMELINE:-0}" = 1 ]; then
    TAIL_LINES=0 run timeline 200 python3 benchmarks/timeline.py "$W/pair-timeline.json"
  fi
fi
