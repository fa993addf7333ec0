"""A/B of launcher settings under both L2 states, on a GPU.

    python benchmarks/flush_ab.py OUT.json

`decode_variants.py` times with do_bench, whose zeroing flush leaves the L2 dirty before every
call (`l2_state.py`); a serving step starts with it clean. This times each case's CUDA-graph
replay after both flushes (`l2_state.flushes`, `event_median_us`) for arms A, B, A, B — each arm
a set of `fp8mla.decode` or kernel-module attributes (`decode_variants._owner`), each case
checked against the reference first. Session 23: the fp8 8-row form's 4-stage ring (one
program per SM) against 3 stages (two), where timeline.py's replays hinted that the two disagree
at B=64 × 8K under a clean L2.
"""

from __future__ import annotations

import json
import sys

from decode_variants import _owner
from l2_state import event_median_us, flushes

from fp8mla.bench.decode import DecodeCase, checked_plan
from fp8mla.bench.harness import announced_ceiling, env_info, graphed

# first run (224ae48): the fp8 8-row form at 4 stages (one program an SM) against 3 (two);
# now fp8_ds_mla's deep-ring rule (3 stages, one an SM, for programs of ≤ 32 tiles) against
# 2 stages everywhere
ARMS = [("deep rule", {}), ("2 stages", {"SM90_MMA8_DS_DEEP_MAX_TILES": 0})]
CASES = [(DecodeCase(1, 131072, 8), "fp8_ds_mla"), (DecodeCase(16, 8192, 8), "fp8_ds_mla"),
         (DecodeCase(1, 65536, 8), "fp8_ds_mla"), (DecodeCase(8, 32768, 8), "fp8_ds_mla")]


def main() -> int:
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    modes = flushes()
    rows = []
    for case, fmt_name in CASES:
        for label, patch in ARMS + ARMS:
            saved = {k: getattr(*_owner(k)) for k in patch}
            try:
                for k, v in patch.items():
                    setattr(*_owner(k), v)
                plan, fn = checked_plan(case, fmt_name)
                one = graphed(fn)
                row = {"case": case.name(f"dense_decode/{fmt_name}", fmt_name), "arm": label,
                       "patch": patch, "kernel": plan.kernel, "splits": plan.num_splits,
                       "ring": plan.ring_stages}
                for mode in ("zero", "read"):
                    row[f"us_{mode}"] = round(event_median_us(one, modes[mode]), 2)
            finally:
                for k, v in saved.items():
                    setattr(*_owner(k), v)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
