"""Where a short decode's fixed cost goes: per-kernel GPU time inside one CUDA-graph replay,
and replay time against tiles per program (a split sweep), on a GPU.

    python benchmarks/decode_phases.py OUT.json

Session 10's reading of the H200 figures: time ≈ tiles per program × t + f with f ≈ 12–17 µs
for 16-row programs (the pool case, one tile per program, takes 15.6 µs; B=1 × 128K, 8 tiles,
45.6) — a quarter of the B=1 × 128K case. This splits f into the decode kernel, the split
combine and the gaps between launches (graph replay time − the kernels' GPU time), and fits t
and f per case from the sweep. Each case is checked against the reference first.
"""

from __future__ import annotations

import functools
import json
import math
import sys

import torch

from fp8mla.bench.decode import POOL_CASE, DecodeCase, _check, make_problem
from fp8mla.bench.harness import announced_ceiling, env_info, graphed, time_us
from fp8mla.decode import DecodePlan

CASES = [  # (case, format, split counts to sweep; None = the scheduler's)
    (POOL_CASE, "fp8", [None, 16, 32]),
    (DecodeCase(1, 131072, 8), "fp8", [None, 64, 128]),
    (DecodeCase(1, 131072, 8), "fp8_ds_mla", [None, 128]),
    (DecodeCase(64, 8192, 16), "fp8", [None, 2]),
]


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


def main() -> int:
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    rows = []
    for case, fmt_name, sweep in CASES:
        fmt, kv, table, seqlens, q, scale = make_problem(case, fmt_name)
        name = case.name(f"dense_decode/{fmt_name}", fmt_name)
        for splits in sweep:
            plan = DecodePlan(batch=case.batch, num_heads=case.heads, s_q=case.s_q,
                              kv_format=fmt, page_size=case.page_size, cache_seqlens=seqlens,
                              device="cuda", num_splits=splits)
            fn = functools.partial(plan.run, q, kv, table, seqlens, fp8_scale=scale,
                                   check=False)
            o, lse = fn()
            _check(case, fmt, kv, table, seqlens, q, scale, o, lse)
            replay = graphed(fn)
            us = time_us(replay)
            chunk = math.ceil(case.context / plan.num_splits)
            tiles = math.ceil(chunk / plan.config.block_n)
            row = {"case": name, "splits": plan.num_splits, "tiles_per_program": tiles,
                   "us": round(us, 2)}
            if splits is None:
                try:
                    row["kernels_us"] = kernel_times(replay)
                    row["gaps_us"] = round(us - sum(row["kernels_us"].values()), 2)
                except Exception as e:  # noqa: BLE001 — the sweep's times still count
                    row["profile_error"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
