"""Where a dense or sparse decode's time goes, program by program, on a GPU.

    python benchmarks/timeline.py OUT.json [sparse]    (sparse: the sparse cases only)

The dense fp8 ≤ 16-row kernel (`decode_sm90_mma8`) and the sparse ≤ 8-row one
(`decode_sm90_mma8_sparse`, since session 37) stamp each program's global timer (ns)
and SM clock at entry, at its loop's start (ring started, q staged), when tile 0 has landed,
at its loop's end and at exit, and its SM (`DecodePlan.timeline`). Each case's CUDA-graph
replay runs after do_bench's zeroing flush and after a reading one (`l2_state.py`); per run,
relative to the first program's entry: when programs enter, when their first tile lands, how
long their loops take, when they leave — quantiles over programs, medians over runs. Also
the time the last program leaves against the replay's event time. Session 18–22's question:
a B=1 × 128K decode runs one wave of 256 programs of 8 tiles and takes 25.6 µs of kernel
time with a clean L2 where its bytes need 17.2 at the read ceiling — launch, the ring's fill,
the programs' spread or the tail?
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from fp8mla.bench.decode import DecodeCase, checked_plan
from fp8mla.bench.harness import (
    announced_ceiling,
    env_info,
    event_median_us,
    graphed,
    l2_flushes,
    script_args,
)
from fp8mla.bench.sparse import checked_sparse_plan

# (case, format, num_splits or None for the scheduler's)
# (session 23's first run, 7900be9, also timed B=1 × 128K at 128 and 132 splits and B=1 × 32K,
# with the 8-row form at two programs an SM)
CASES = [(DecodeCase(1, 131072, 8), "fp8", None), (DecodeCase(64, 8192, 8), "fp8", None),
         (DecodeCase(64, 8192, 16), "fp8", None)]
# sparse fp8_ds_mla: (batch, heads, topk, num_splits or None); B=64 × 8 is #4's H=8 case
SPARSE_CASES = [(64, 8, 2048, None), (128, 8, 2048, None)]
RUNS = 30
QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)


def quantiles(xs) -> list[float]:
    xs = sorted(xs)
    return [round(xs[min(len(xs) - 1, int(q * len(xs)))] / 1000, 2) for q in QUANTILES]


def summary(st: torch.Tensor) -> dict:
    """One run's stamps [programs, 12] → phase quantiles (µs) over programs."""
    gt = st[:, 0:10:2].tolist()  # globaltimer at the five stamps
    t0 = min(g[0] for g in gt)
    clk = st[:, 1:10:2].tolist()
    return {
        "enter": quantiles(g[0] - t0 for g in gt),
        "loop_start": quantiles(g[1] - t0 for g in gt),
        "first_landed": quantiles(g[2] - t0 for g in gt),
        "wait_first": quantiles(g[2] - g[1] for g in gt),
        "loop": quantiles(g[3] - g[2] for g in gt),
        "write": quantiles(g[4] - g[3] for g in gt),
        "leave": quantiles(g[4] - t0 for g in gt),
        "prologue_cycles": quantiles(1000 * (c[1] - c[0]) for c in clk),
    }


def merged(runs: list[dict]) -> dict:
    """Per phase and quantile, the median over runs."""
    return {k: [round(statistics.median(r[k][i] for r in runs), 2)
                for i in range(len(QUANTILES))] for k in runs[0]}


def per_sm(st: torch.Tensor) -> dict:
    """Per count of programs an SM held: how many SMs, and their last program's leave time
    (µs: median, max)."""
    t0 = int(st[:, 0].min())
    by_sm: dict[int, list[int]] = {}
    for row in st.tolist():
        by_sm.setdefault(row[10], []).append(row[8] - t0)
    out = {}
    for n in sorted({len(v) for v in by_sm.values()}):
        leaves = [max(v) for v in by_sm.values() if len(v) == n]
        out[str(n)] = {"sms": len(leaves),
                       "leave_median_us": round(statistics.median(leaves) / 1000, 2),
                       "leave_max_us": round(max(leaves) / 1000, 2)}
    return out


def cases(sparse_only: bool):
    """(name, plan, checked call) of each case: `CASES` (unless ``sparse_only``), then
    `SPARSE_CASES`."""
    if not sparse_only:
        for case, fmt_name, splits in CASES:
            plan, fn = checked_plan(case, fmt_name, num_splits=splits)
            yield case.name(f"dense_decode/{fmt_name}", fmt_name), plan, fn
    for batch, heads, topk, splits in SPARSE_CASES:
        yield checked_sparse_plan(batch, heads, topk, num_splits=splits)


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    modes = l2_flushes()
    rows = []
    for name, plan, fn in cases(sys.argv[2:3] == ["sparse"]):
        if plan.kernel not in ("mma8", "mma16") or (not plan.sparse and plan.fmt.name != "fp8"):
            print(f"{name}: {plan.kernel} kernel, no timeline", flush=True)
            continue
        plain = graphed(fn)  # the replay without stamps, for what they cost
        plain_us = {mode: round(event_median_us(plain, modes[mode]), 2)
                    for mode in ("zero", "read")}
        programs = plan.head_blocks * plan.batch * plan.num_splits
        plan.timeline = torch.zeros(programs, 12, dtype=torch.int64, device="cuda")
        replay = graphed(fn)
        for mode in ("zero", "read"):
            flush, runs, events, raw = modes[mode], [], [], None
            for r in range(RUNS + 3):
                flush()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                replay()
                e.record()
                torch.cuda.synchronize()
                if r < 3:
                    continue  # warm-up
                st = plan.timeline.cpu()
                runs.append(summary(st))
                events.append(1000 * s.elapsed_time(e))
                raw = st
            gt = sorted(set(raw[:, 0:10:2].flatten().tolist()))
            row = {"case": name, "kernel": plan.kernel, "splits": plan.num_splits,
                   "programs": programs, "flush": mode,
                   "replay_us": round(statistics.median(events), 2),
                   "replay_us_without_stamps": plain_us[mode],
                   "timer_step_ns": min(b - a for a, b in zip(gt, gt[1:], strict=False) if b > a),
                   "phases_us": merged(runs), "per_sm_last_run": per_sm(raw),
                   "last_run": raw.tolist()}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "last_run"}), flush=True)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "quantiles": QUANTILES,
                           "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
