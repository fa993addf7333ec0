"""Timing, the read ceiling, and result records shared by every benchmark.

Times are medians of ``triton.testing.do_bench`` (events; L2 flushed before each call) after
warm-up. Every run measures the read ceiling itself and reports each case's ratio to it.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch
import triton

from fp8mla.kernels.launch import OPTIONS
from fp8mla.kernels.stream import _stream_read_kernel

__all__ = ["script_args", "Record", "time_us", "time_us_clean_l2", "graphed", "read_ceiling_tbps",
           "env_info", "write_records"]


@dataclass
class Record:
    """One benchmark row, docs/DESIGN.md §9's schema."""

    case: str
    backend: str
    us: float
    TBps: float | None
    TFLOPS: float | None
    ceiling_TBps: float
    gpu: str
    torch: str
    triton: str
    date: str
    commit: str
    note: str | None = None


def time_us(fn, *, warmup_ms: int = 50, rep_ms: int = 300) -> float:
    """Median time of ``fn()`` in microseconds."""
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                            return_mode="median")


FLUSH_BYTES = 256 * 2**20  # do_bench's flush buffer: five times the H200's L2
_flush_buffer: torch.Tensor | None = None


def l2_flushes() -> dict:
    """What can precede a timed call: ``zero`` — do_bench's flush, zeroing 256 MB (the L2 left
    full of dirty lines the call's reads must write back), ``read`` — a sum over the same
    buffer (the L2 left holding clean lines, as a serving step finds it), ``none``."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    buf = _flush_buffer
    return {"zero": buf.zero_, "read": lambda: buf.sum(), "none": lambda: None}


def event_median_us(fn, flush, reps: int = 200, calls: int = 1) -> float:
    """Median over ``reps`` of the event time around ``fn()``, each after ``flush()``, divided
    by ``calls`` (the calls ``fn`` makes); ten warm-up rounds first."""
    for _ in range(10):
        flush()
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return 1000 * statistics.median(times) / calls


def time_us_clean_l2(fn) -> float:
    """Median time of ``fn()`` in microseconds, each call after a reading flush (`l2_flushes`):
    what `time_us` measures without the write-back of do_bench's dirty L2."""
    return event_median_us(fn, l2_flushes()["read"])


def graphed(fn):
    """``fn`` captured once in a CUDA graph (after two warm-up calls on a side stream, which
    also compile its kernels): the graph's replay, a callable."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def read_ceiling_tbps(gib: float = 4.0) -> float:
    """Streaming-read bandwidth of a Triton kernel over a ``gib`` GiB buffer, TB/s."""
    n_words = int(gib * 2**30) // 4
    x = torch.ones(n_words, dtype=torch.int32, device="cuda")
    block, iters = 4096, 16
    grid = (triton.cdiv(n_words, block * iters),)
    out = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    fn = lambda: _stream_read_kernel[grid](x, out, n_words, BLOCK=block, ITERS=iters,
                                           num_warps=8, **OPTIONS)
    us = time_us(fn)
    return n_words * 4 / (us * 1e-6) / 1e12


def script_args(usage: str | None, nargs: int = 1, *, gpu: bool = True) -> list[str]:
    """A benchmarks/ script's command line after its two guards: fewer than ``nargs``
    arguments (or ``-h`` / ``--help``) print ``usage`` (the script's docstring) and exit 2;
    ``gpu`` on a machine without CUDA says the script needs one and exits 2 — before any
    tensor is made. Returns sys.argv."""
    name = os.path.basename(sys.argv[0])
    if len(sys.argv) <= nargs or {"-h", "--help"} & set(sys.argv[1:]):
        print(f"usage: python {name} (at least {nargs} argument{'s' * (nargs != 1)})\n\n"
              f"{(usage or '').strip()}", file=sys.stderr)
        sys.exit(2)
    if gpu and not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU (none found)", file=sys.stderr)
        sys.exit(2)
    return sys.argv


def announced_ceiling(env: dict[str, str]) -> float:
    """`read_ceiling_tbps`, printed with the GPU and Triton version: the first line of a
    benchmark script's log."""
    ceiling = read_ceiling_tbps()
    print(f"{env['gpu']} triton {env['triton']} ceiling {ceiling:.2f} TB/s", flush=True)
    return ceiling


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def env_info() -> dict[str, str]:
    """GPU name, versions, date and commit for every record: ``FP8MLA_COMMIT`` where set (a
    copy of a tree whose git state is not its own, as the device machines get), else HEAD,
    marked ``+dirty`` where tracked files differ from it."""
    commit = os.environ.get("FP8MLA_COMMIT")
    if not commit:
        commit = _git("rev-parse", "--short", "HEAD") or "unknown"
        if commit != "unknown" and _git("status", "--porcelain", "--untracked-files=no"):
            commit += "+dirty"
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.date.today().isoformat(), "commit": commit,
    }


def rate_record(case: str, backend: str, us: float, moved: int | None, flops: int | None,
                ceiling: float, env: dict, note: str | None = None) -> Record:
    """One `Record` of ``us`` microseconds: TB/s of ``moved`` bytes and TFLOPS of ``flops``
    (None where not given), the read ceiling of the same run, ``env``'s fields."""
    return Record(case=case, backend=backend, us=round(us, 2),
                  TBps=round(moved / (us * 1e-6) / 1e12, 3) if moved else None,
                  TFLOPS=round(flops / (us * 1e-6) / 1e12, 1) if flops else None,
                  ceiling_TBps=round(ceiling, 3), note=note, **env)


def write_records(records: list[Record], path: str) -> None:
    """Write records as a JSON list (docs/DESIGN.md §9)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump([asdict(r) for r in records], f, indent=1)


def by_backend(records: list[Record], backend: str) -> Record:
    """The record of ``backend`` among one case's (e.g. "fp8mla_graph": do_bench's replay,
    "fp8mla_graph_cleanL2": the same replay with a clean L2)."""
    for rec in records:
        if rec.backend == backend:
            return rec
    raise KeyError(f"backend: no {backend!r} among {[r.backend for r in records]}")


def keep_row(path: str, rows: list[dict], row: dict, **header) -> None:
    """A benchmark script's row: appended to ``rows``, printed as a JSON line, and ``path``
    rewritten as ``{**header, "rows": rows}`` — a run cut short keeps every row it measured."""
    rows.append(row)
    print(json.dumps(row), flush=True)
    with open(path, "w") as f:
        json.dump({**header, "rows": rows}, f, indent=1)


def kernel_note(plan) -> str:
    """What serves ``plan`` (a `DecodePlan` or `SparsePlan`), for a record's note: the Gluon
    ≤ 16-row kernels' rows, ring and first product (qk8: FP8 wgmma), else the plan's
    `DecodeConfig` (the Triton kernel's; the 64-head Gluon kernels take only their tile sizes
    from it, and store bf16 rows in dim order or not: `fp8mla.decode.SM90_ROWS_IN_ORDER`)."""
    from fp8mla import decode

    head = f"kernel={plan.kernel} splits={plan.num_splits}"
    tail = f" pdl={plan._pdl and plan.num_splits > 1} programs/SM={plan.programs_per_sm}"
    if plan.num_splits > 1:  # the split partials' dtype (`fp8mla.decode.partials_dtype`)
        tail += f" partials={str(plan.part_out.dtype).removeprefix('torch.')}"
    if plan.kernel == "sm90":  # the 64-row form; its programs: a query's 64 heads each, or
        # (packed) every query's heads
        tail += f" form={plan.sm90_form} rows_in_order={decode.SM90_ROWS_IN_ORDER}"
        if getattr(plan, "packed", False):
            tail += " packed=True"
    if plan.mma8:  # ("mma8", "mma16"; head blocks: `fp8mla.decode.DecodePlan._head_block`)
        blocks = f" head_blocks={plan.head_blocks}" if plan.head_blocks > 1 else ""
        return (f"{head} rows={plan.mma_rows}{blocks} ring={plan.ring_stages} qk8={plan.qk8}"
                f"{tail}")
    c = plan.config
    return (f"{head} block_n={c.block_n} heads/block={c.heads_per_block} warps={c.num_warps}"
            f" stages={c.num_stages} words_2d={c.words_2d} fold_scales={c.fold_scales}"
            f" tma={plan.tma} lookahead={c.lookahead} lazy={c.lazy_rescale}"
            f" late_sum={c.late_sum}{tail}")
