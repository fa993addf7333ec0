"""A sparse case's fixed cost per program, on a GPU: the same batch, heads and split count with
the lists' width swept, so each program's tile count grows while its start (q staged, the first
gathers' latency), its partial's write and the combine stay; a least-squares line through the
CUDA-graph replays (both L2 flushes, `fp8mla.bench.harness.l2_flushes`) splits the time into
µs a tile and µs fixed.

    python benchmarks/fixed_cost.py OUT.json [BATCH HEADS SPLITS]   (default 64 8 4)

Session 36 (BENCHMARKS.md) inferred from the prefill cases that sparse B=64 × 8 heads spends
~12 of its 38.8 µs (clean) outside its tiles; this measures it directly.
"""

from __future__ import annotations

import sys

from fp8mla.bench.harness import (
    announced_ceiling,
    env_info,
    event_median_us,
    graphed,
    keep_row,
    l2_flushes,
    script_args,
)
from fp8mla.bench.sparse import checked_sparse_plan

WIDTHS = (512, 1024, 2048, 4096, 8192)  # tiles a program: width / 64 / splits


def fit(xs, ys):
    """(slope, intercept) of the least-squares line through (xs, ys)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
    return slope, my - slope * mx


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    batch, heads, splits = (int(x) for x in (sys.argv[2:5] or (64, 8, 4)))
    env = env_info()
    ceiling = announced_ceiling(env)
    modes = l2_flushes()
    rows, tiles, times = [], [], {"zero": [], "read": []}
    for width in WIDTHS:
        name, plan, fn = checked_sparse_plan(batch, heads, width, num_splits=splits)
        one = graphed(fn)
        row = {"case": name, "kernel": plan.kernel, "splits": plan.num_splits,
               "tiles_a_program": width // 64 // splits}
        for mode in times:
            row[f"us_{mode}"] = round(event_median_us(one, modes[mode]), 2)
            times[mode].append(row[f"us_{mode}"])
        tiles.append(row["tiles_a_program"])
        keep_row(out_path, rows, row, env=env, ceiling_TBps=ceiling)
    for mode, ys in times.items():
        slope, fixed = fit(tiles, ys)
        row = {"fit": mode, "us_a_tile": round(slope, 3), "us_fixed": round(fixed, 2)}
        keep_row(out_path, rows, row, env=env, ceiling_TBps=ceiling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
