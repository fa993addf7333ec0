"""A/B of two source trees on a GPU: the same cases, each checked against the reference, then
its CUDA-graph replay timed after both flushes (`fp8mla.bench.harness.l2_flushes`: do_bench's
zeroing one, the targets' timer, and a reading one that leaves the L2 clean).

    PYTHONPATH=A/src python benchmarks/tree_ab.py OUT_A1.json A
    PYTHONPATH=B/src python benchmarks/tree_ab.py OUT_B1.json B   # then A, B again

One process per tree and run (kernels compile from the tree imported), so a change to kernel
code is timed against the code before it without a switch left in the kernels; alternate the
trees (ABAB) and read both columns (session 23: a schedule can beat one flush and lose the
other). Uses only what `fp8mla.bench` has had since session 23, so an older tree runs it too.
"""

from __future__ import annotations

import sys

import fp8mla
from fp8mla.bench.decode import DecodeCase, checked_plan
from fp8mla.bench.harness import (
    announced_ceiling,
    env_info,
    event_median_us,
    graphed,
    keep_row,
    l2_flushes,
    script_args,
)
from fp8mla.bench.sparse import check_sparse, sparse_problem
from fp8mla.formats import kv_format
from fp8mla.sparse import SparsePlan

DENSE = [(DecodeCase(64, 8192, 16), "fp8"), (DecodeCase(1, 131072, 8), "fp8"),
         (DecodeCase(64, 8192, 8), "fp8"), (DecodeCase(64, 8192, 16), "fp8_ds_mla"),
         (DecodeCase(1, 131072, 8), "fp8_ds_mla")]
SPARSE = [(64, 8, 2048)]  # (queries, heads, topk), fp8_ds_mla, s_q 1


def _sparse(batch, heads, topk):
    """A checked sparse plan's call over `sparse_problem`'s inputs."""
    fmt = kv_format("fp8_ds_mla")
    rows, idx, q = sparse_problem(batch, heads, topk, 1, fmt, "cuda")
    plan = SparsePlan(num_queries=batch, num_heads=heads, topk=topk, kv_format=fmt,
                      device="cuda")
    fn = lambda: plan.run(q, rows, idx, check=False)  # noqa: E731
    check_sparse(fn()[0], q, rows, idx, fmt)
    return fn


def main() -> int:
    script_args(__doc__, 2)
    out_path, label = sys.argv[1], sys.argv[2]
    env = dict(env_info(), tree=label, fp8mla=fp8mla.__file__)
    ceiling = announced_ceiling(env)
    modes = l2_flushes()
    calls = [(case.name(f"dense_decode/{fmt}", fmt), lambda c=case, f=fmt: checked_plan(c, f)[1])
             for case, fmt in DENSE]
    calls += [(f"sparse_decode/fp8_ds_mla/B{b}-H{h}-topk{k}-sq1", lambda a=(b, h, k): _sparse(*a))
              for b, h, k in SPARSE]
    print(f"{label}: fp8mla from {fp8mla.__file__}", flush=True)
    rows = []
    for name, make in calls:
        one = graphed(make())
        row = {"case": name, "tree": label}
        for mode in ("zero", "read"):
            row[f"us_{mode}"] = round(event_median_us(one, modes[mode]), 2)
        print(f"{label:<6} {name:<56} zero {row['us_zero']:7.2f}  read {row['us_read']:7.2f}",
              flush=True)
        keep_row(out_path, rows, row, env=env, ceiling_TBps=ceiling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
