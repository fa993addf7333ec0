"""What the timer's L2 flush charges a decode, on a GPU.

    python benchmarks/l2_state.py OUT.json

`fp8mla.bench.harness.time_us` is `triton.testing.do_bench`, which before every timed call
zeroes a 256 MB buffer: the L2 starts each call full of dirty lines, which the decode must
write back to DRAM as its reads evict them — a cost no serving step pays (its previous kernels
write megabytes, not the L2's 50). Session 21's `decode_phases` found 8–9 µs between a
replay's time and its kernels' GPU time at B=64 × 8K × 16 heads and B=1 × 128K, 5 µs in the
small pool case. This times each case's CUDA-graph replay, one decode and ten in one graph,
with events around each call after three flushes: `zero` (do_bench's), `read` (a sum over the
same 256 MB: the L2 left holding clean lines) and `none`; and, per flush, each kernel's GPU time
(the profiler, 20 calls). Each case is checked against the reference first. Session 22's
run (87b29d9): the zeroing flush costs 3.6 µs at B=64 × 16 heads and 6.3 µs at B=1 × 128K
(BENCHMARKS.md). `SPARSE_CASES`: #4's B=64 × 8 heads × topk 2048 (added after that run).
A second argument ``dense`` or ``sparse`` runs only those cases.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch

from fp8mla.bench.decode import POOL_CASE, DecodeCase, checked_plan
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

CASES = [(DecodeCase(64, 8192, 16), "fp8"), (DecodeCase(1, 131072, 8), "fp8"), (POOL_CASE, "fp8"),
         (DecodeCase(64, 8192, 16), "fp8_ds_mla")]
SPARSE_CASES = [(64, 8, 2048)]  # (queries, heads, topk), fp8_ds_mla, s_q 1
def kernel_us(fn, flush, calls: int = 1, reps: int = 20) -> dict[str, float]:
    """GPU µs per call of each kernel launched by ``fn`` (not the flush's), each rep after
    ``flush()``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        flush()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        torch.cuda.synchronize()
    return {e.key[:40]: round(e.device_time_total / (reps * calls), 2)
            for e in prof.key_averages()
            if e.device_type.name == "CUDA" and e.count and ("mla" in e.key or "combine" in e.key)}


def call_n(fn, n: int) -> None:
    for _ in range(n):
        fn()


def dense_cases():
    """(name, plan, checked call) of each dense case."""
    for case, fmt_name in CASES:
        yield (case.name(f"dense_decode/{fmt_name}", fmt_name),
               *checked_plan(case, fmt_name))


def sparse_cases():
    """The same for the sparse cases (the first two queries checked)."""
    for batch, heads, topk in SPARSE_CASES:
        yield checked_sparse_plan(batch, heads, topk)


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    modes = l2_flushes()
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    rows = []
    for name, plan, fn in itertools.chain(dense_cases() if which != "sparse" else (),
                                          sparse_cases() if which != "dense" else ()):
        one, ten = graphed(fn), graphed(functools.partial(call_n, fn, 10))
        for mode, flush in modes.items():
            row = {"case": name, "kernel": plan.kernel, "splits": plan.num_splits, "flush": mode,
                   "us": round(event_median_us(one, flush), 2),
                   "us_per_call_in_10": round(event_median_us(ten, flush, reps=50, calls=10), 2),
                   "kernels_us": kernel_us(one, flush),
                   "kernels_us_in_10": kernel_us(ten, flush, calls=10)}
            row["gaps_us"] = round(row["us"] - sum(row["kernels_us"].values()), 2)
            keep_row(out_path, rows, row, env=env, ceiling_TBps=ceiling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
