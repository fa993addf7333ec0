"""Where a short decode's fixed cost goes: per-kernel GPU time inside one CUDA-graph replay,
and replay time against tiles per program (a split sweep), on a GPU.

    python benchmarks/decode_phases.py OUT.json

Session 10's reading of the H200 figures: time ≈ tiles per program × t + f with f ≈ 12–17 µs
for 16-row programs (the pool case, one tile per program, takes 15.6 µs; B=1 × 128K, 8 tiles,
45.6) — a quarter of the B=1 × 128K case. This splits f into the decode kernel, the split
combine and the gaps between launches (graph replay time − the kernels' GPU time), and fits t
and f per case from the sweep. Each case is checked against the reference first. Sparse
decode (#4's B=64 × 8 and 64 heads, fp8_ds_mla, topk 2048: `fp8mla bench sparse`'s data) is
split the same way — its 64-row plans also launch the index-list compaction.
"""

from __future__ import annotations

import functools
import json
import math
import sys

import torch

from fp8mla.bench.decode import POOL_CASE, DecodeCase, checked_plan
from fp8mla.bench.harness import announced_ceiling, env_info, graphed, script_args, time_us
from fp8mla.bench.sparse import check_sparse, sparse_problem
from fp8mla.formats import kv_format
from fp8mla.sparse import SparsePlan

CASES = [  # (case, format, split counts to sweep; None = the scheduler's)
    (POOL_CASE, "fp8", [None, 16, 32]),
    (DecodeCase(1, 131072, 8), "fp8", [None, 64, 128]),
    (DecodeCase(1, 131072, 8), "fp8_ds_mla", [None, 128]),
    (DecodeCase(64, 8192, 16), "fp8", [None, 2]),
    (DecodeCase(64, 8192, 8), "fp8", [None, 2]),  # session 19: the ≤ 8-row Gluon kernel's
]
SPARSE_CASES = [((64, 8, 2048), [None, 2, 8]), ((64, 64, 2048), [None, 1, 4])]


def kernel_times(replay) -> dict[str, float]:
    """GPU µs per kernel name over one replay (the mean of 20 profiled replays)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            replay()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            out[e.key[:60]] = round(e.device_time_total / 20, 2)
    return out


def measure(name, plan, fn, tiles, streamed=False) -> dict:
    """Replay time of ``fn`` from a CUDA graph and, for the scheduler's split count, its GPU time
    per kernel (the rest: gaps between and around the launches) and, where ``streamed`` (its
    cache far larger than L2, so that repeats still read DRAM), its time per call in a graph of
    ten calls — a layer's share of a graph that holds a whole step, the graph's own start paid
    once."""
    replay = graphed(fn)
    row = {"case": name, "splits": plan.num_splits, "tiles_per_program": tiles,
           "us": round(time_us(replay), 2)}
    if plan.requested_splits is None and streamed:
        row["us_per_call_in_10"] = round(time_us(graphed(lambda: [fn() for _ in range(10)])) / 10,
                                         2)
    if plan.requested_splits is None:
        try:
            row["kernels_us"] = kernel_times(replay)
            row["gaps_us"] = round(row["us"] - sum(row["kernels_us"].values()), 2)
        except Exception as e:  # noqa: BLE001 — the sweep's times still count
            row["profile_error"] = f"{type(e).__name__}: {e}"[:200]
    return row


def sparse_rows(batch, heads, topk, sweep):
    """The sparse case (fp8_ds_mla, s_q 1) at each split count; the first two queries checked
    against the reference."""
    fmt = kv_format("fp8_ds_mla")
    rows, idx, q = sparse_problem(batch, heads, topk, 1, fmt, "cuda")
    name = f"sparse_decode/fp8_ds_mla/B{batch}-H{heads}-topk{topk}-sq1"
    for splits in sweep:
        plan = SparsePlan(num_queries=batch, num_heads=heads, topk=topk, kv_format=fmt,
                          device="cuda", num_splits=splits)
        plan.requested_splits = splits
        fn = functools.partial(plan.run, q, rows, idx, check=False)
        check_sparse(fn()[0], q, rows, idx, fmt)
        chunk = math.ceil(topk / plan.num_splits)
        yield measure(name, plan, fn, math.ceil(chunk / plan.config.block_n), streamed=True)


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(out_path, "w") as f:
            json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)

    for case, fmt_name, sweep in CASES:
        name = case.name(f"dense_decode/{fmt_name}", fmt_name)
        for splits in sweep:
            plan, fn = checked_plan(case, fmt_name, num_splits=splits)
            plan.requested_splits = splits
            chunk = math.ceil(case.context / plan.num_splits)
            streamed = case.kv_bytes(plan.fmt.row_bytes) > 64 * 2**20  # H200: 50 MB of L2
            emit(measure(name, plan, fn, math.ceil(chunk / plan.config.block_n), streamed))
    for (batch, heads, topk), sweep in SPARSE_CASES:
        for row in sparse_rows(batch, heads, topk, sweep):
            emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
