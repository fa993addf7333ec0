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
from fp8mla.bench.floors import gather_floor, read_floor
from fp8mla.bench.harness import env_info, event_median_us, graphed, l2_flushes, script_args, time_us
from fp8mla.bench.sparse import POOL_TOKENS, sparse_bytes
from fp8mla.formats import kv_format


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


STREAM_SWEEP = tuple((4096, steps, 8) for steps in (1, 2, 4, 8, 16))
GATHER_SWEEP = ((16, 1, 1), (16, 1, 2), (32, 1, 2), (32, 1, 4), (32, 2, 4), (64, 1, 4),
                (64, 2, 4), (64, 4, 4), (64, 1, 8), (128, 1, 8), (128, 2, 8))


def _rates(best: dict, n_bytes: int) -> dict:
    """{timer: (µs, shape)} → {timer: (µs, TB/s on ``n_bytes``, shape)}."""
    return {t: (round(us, 2), round(n_bytes / us / 1e6, 3), shape)
            for t, (us, shape) in best.items()}


def floors(timed: dict) -> dict:
    """`floors.read_floor` of every FLOOR_CASES case, then `floors.gather_floor` of the sparse
    case's shape (64 lists of 2048 slots drawn uniformly over bench sparse's 1M-row pool), each
    over a wider sweep of program shapes than the benchmarks': {row name: {timer: (µs, TB/s,
    shape)}}."""
    rows = {}
    pool = torch.ones(POOL_TOKENS, kv_format("fp8_ds_mla").row_bytes, dtype=torch.uint8,
                      device="cuda")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, POOL_TOKENS, (64, 2048), generator=g, dtype=torch.int32).cuda()
    for evict in ("", "evict_first"):  # the loads' L2 eviction policy
        tail = f" {evict}" if evict else ""
        for name, n_bytes in FLOOR_CASES.items():
            rows[f"read {name} ({n_bytes} B){tail}"] = row = _rates(
                read_floor(n_bytes, timed, shapes=STREAM_SWEEP, evict=evict), n_bytes)
            print("read", name, tail, row, flush=True)
        n_bytes = FLOOR_CASES["sparse fp8_ds_mla B64x8 topk2048"]
        rows[f"gather sparse fp8_ds_mla B64x8 topk2048{tail}"] = row = _rates(
            gather_floor(pool, idx, timed, shapes=GATHER_SWEEP, evict=evict), n_bytes)
        print("gather", tail, row, flush=True)
    return rows


def main() -> None:
    script_args(__doc__)
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
