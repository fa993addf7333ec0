"""What a decode call costs besides its kernels, on the GPU: the host's time per eager call (and
where cProfile puts it), and the floor any CUDA-graph replay pays under the benchmark's timers
(graphs of one and two no-op kernels, the second as a programmatic dependent launch as the
split combine is), and the fastest a graph replay can read a case's bytes under those timers
(the streaming-read kernel of the ceiling alone, over the bytes of the B=1 × 128K fp8 case,
the sparse B=64 × 8-head case and the B=64 × 8K × 16 case) — and, for the sparse case, the
fastest a replay can gather its rows: a kernel that only reads the listed 656-byte rows of the
same shape (64 lists of 2048 slots drawn uniformly over bench sparse's 1M-row pool).

    python benchmarks/launch_costs.py OUT.json [--floors]   (--floors: the floors alone)

Host time per call: the wall time of 200 calls enqueued back to back, divided by 200, for
cases whose GPU time is far below it (the queue never fills), then the same calls under
cProfile (the top 25 functions by own time go to OUT.json's ``profile``).
"""

import cProfile
import io
import json
import pstats
import sys
import time

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from fp8mla.bench.decode import DecodeCase, checked_plan
from fp8mla.bench.harness import env_info, event_median_us, graphed, l2_flushes, time_us
from fp8mla.bench.sparse import POOL_TOKENS, sparse_bytes
from fp8mla.formats import kv_format
from fp8mla.kernels.stream import _gather_read_kernel, _stream_read_kernel


def _dense_bytes(case: DecodeCase) -> int:
    return case.kv_bytes(kv_format("fp8").row_bytes) + case.io_bytes()


# the bytes each target case moves, as bench decode / bench sparse count them
FLOOR_CASES = {"fp8 B1x128Kx8": _dense_bytes(DecodeCase(1, 131072, 8)),
               "sparse fp8_ds_mla B64x8 topk2048": sparse_bytes(
                   64, 8, 2048, 1, kv_format("fp8_ds_mla").row_bytes),
               "fp8 B64x8Kx16": _dense_bytes(DecodeCase(64, 8192, 16))}


@triton.jit
def _nop(x_ptr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
    if tl.program_id(0) == 0:
        tl.store(x_ptr, 1.0)
    if PDL:
        gdc_launch_dependents()


def host_us(fn, calls: int = 200) -> tuple[float, float]:
    """(host µs per call, wall µs per call including the GPU's drain)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t0) / calls


def top_functions(fn, calls: int = 200, n: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(n)
    return text.getvalue()


def nop_graphs() -> dict[str, object]:
    x = torch.zeros(1, device="cuda")
    one = lambda: _nop[(132,)](x, PDL=False)  # noqa: E731
    two = lambda: (_nop[(132,)](x, PDL=False), _nop[(132,)](x, PDL=False))  # noqa: E731
    pdl = lambda: (_nop[(132,)](x, PDL=True),  # noqa: E731
                   _nop[(132,)](x, PDL=True, launch_pdl=True))
    return {"eager_one": one, "graph_one": graphed(one), "graph_two": graphed(two),
            "graph_two_pdl": graphed(pdl)}


def timers() -> dict:
    """do_bench (the targets' timer: a zeroing flush) and the event median after a reading
    flush (the L2 left clean), by name."""
    read = l2_flushes()["read"]
    return {"do_bench": time_us, "read_flush": lambda f: event_median_us(f, read)}


def read_floor(n_bytes: int, timed: dict) -> dict:
    """The streaming-read kernel over ``n_bytes``, replayed from a graph, at the fastest of a few
    program sizes under each of ``timed``'s timers: {timer: (µs, TB/s, words a program)}."""
    block = 4096
    n_words = n_bytes // 4
    x = torch.ones(n_words, dtype=torch.int32, device="cuda")
    best = {}
    for iters in (1, 2, 4, 8, 16):
        grid = (triton.cdiv(n_words, block * iters),)
        out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
        replay = graphed(lambda g=grid, o=out, i=iters: _stream_read_kernel[g](
            x, o, n_words, BLOCK=block, ITERS=i, num_warps=8))
        for name, timer in timed.items():
            us = timer(replay)
            if name not in best or us < best[name][0]:
                best[name] = (round(us, 2), round(n_bytes / us / 1e6, 3), block * iters)
    return best


def gather_floor(batch: int, topk: int, timed: dict) -> dict:
    """The gather-read kernel over ``batch`` lists of ``topk`` slots drawn uniformly over a pool
    of POOL_TOKENS 656-byte rows, replayed from a graph, at the fastest of a few program shapes
    under each of ``timed``'s timers: {timer: (µs, TB/s on the sparse case's bytes, (rows a
    step, steps, warps))}."""
    row_words = kv_format("fp8_ds_mla").row_bytes // 4
    pool = torch.ones(POOL_TOKENS, row_words, dtype=torch.int32, device="cuda")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, POOL_TOKENS, (batch, topk), generator=g, dtype=torch.int32).cuda()
    n_bytes = sparse_bytes(batch, 8, topk, 1, row_words * 4)
    best = {}
    for rows, steps, warps in ((32, 1, 4), (64, 1, 4), (64, 2, 4), (64, 4, 4), (64, 8, 4),
                               (128, 1, 8), (128, 2, 8), (128, 4, 8), (256, 1, 8)):
        grid = (batch, triton.cdiv(topk, rows * steps))
        out = torch.empty(grid, dtype=torch.int32, device="cuda")
        replay = graphed(lambda g=grid, o=out, r=rows, s=steps, w=warps: _gather_read_kernel[g](
            pool, idx, o, topk, ROWS=r, ITERS=s, num_warps=w))
        replay()
        assert out.sum().item() == batch * topk * row_words  # every listed row read, once
        for name, timer in timed.items():
            us = timer(replay)
            if name not in best or us < best[name][0]:
                best[name] = (round(us, 2), round(n_bytes / us / 1e6, 3), (rows, steps, warps))
    return best


def floors(timed: dict) -> dict:
    """`read_floor` of every FLOOR_CASES case, then `gather_floor` of the sparse case."""
    rows = {}
    for name, n_bytes in FLOOR_CASES.items():
        rows[f"read {name} ({n_bytes} B)"] = read_floor(n_bytes, timed)
        print(name, rows[f"read {name} ({n_bytes} B)"], flush=True)
    rows["gather sparse fp8_ds_mla B64x8 topk2048"] = gather_floor(64, 2048, timed)
    print("gather", rows["gather sparse fp8_ds_mla B64x8 topk2048"], flush=True)
    return rows


def main() -> None:
    if "--floors" in sys.argv:  # the read floors alone
        rows = floors(timers())
        with open(sys.argv[1], "w") as f:
            json.dump({"env": env_info(), "floor": rows}, f, indent=1)
        return
    out = {"env": env_info(), "host": {}, "profile": {}, "floor": {}}
    for name, case, fmt in [("fp8 B1x128Kx8", DecodeCase(1, 131072, 8), "fp8"),
                            ("fp8 B64x8Kx16", DecodeCase(64, 8192, 16), "fp8"),
                            ("bf16 B1x128Kx8", DecodeCase(1, 131072, 8), "bf16"),
                            ("fp8 pool-sized B1x4Kx8", DecodeCase(1, 4096, 8), "fp8")]:
        plan, fn = checked_plan(case, fmt)
        host, wall = host_us(fn)
        out["host"][name] = {"host_us": round(host, 1), "wall_us": round(wall, 1),
                             "num_splits": plan.num_splits}
        print(name, out["host"][name], flush=True)
        if name.startswith("fp8 B1x128K"):
            out["profile"][name] = top_functions(fn)
            print(out["profile"][name], flush=True)
    timed = timers()
    # the no-op graphs also with no flush (reads with none would outrun the host: not a floor)
    nop_timed = {**timed, "no_flush": lambda f: event_median_us(f, l2_flushes()["none"])}
    for name, fn in nop_graphs().items():
        out["floor"][name] = row = {t: round(timer(fn), 2) for t, timer in nop_timed.items()}
        print(name, row, flush=True)
    out["floor"].update(floors(timed))
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
