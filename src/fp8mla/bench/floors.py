"""A case's read floor: the fastest a kernel that only reads the case's bytes runs, timed as the
case is (a CUDA-graph replay under the same timer), so a benchmark can say how far a kernel is
from what moving its bytes costs at that size — the replay's fixed cost and the timer's flush
included, which the whole-GPU ceiling (`harness.read_ceiling_tbps`, 4 GiB streamed) leaves out.

- `read_floor`: the ceiling's streaming-read kernel over n bytes (dense decode: a request's
  pages are runs of whole rows, ≥ 36 KB each at 64 tokens).
- `gather_floor`: a kernel that reads whole rows at the slots of the case's own index lists and
  nothing else (sparse decode: 656-byte rows at random slots).

Each times a few program shapes and keeps the fastest per timer; `benchmarks/launch_costs.py
--floors` sweeps more. H200 (session 28, h200-20261203-s28-8eb75ea-floors.json): streaming
fastest at 4096 words a program (× 4 steps for 302 MB with a clean L2, by 0.1 µs), gathering
at 16 rows × 2 warps (do_bench) or 32 rows × 4 warps (clean L2) — all in the shapes below.
"""

from __future__ import annotations

import functools

import torch
import triton

from fp8mla._checks import check_int, check_tensor
from fp8mla.bench.harness import graphed
from fp8mla.kernels.launch import OPTIONS
from fp8mla.kernels.stream import _gather_read_kernel, _stream_read_kernel, word_runs

__all__ = ["STREAM_SHAPES", "GATHER_SHAPES", "read_floor", "gather_floor", "floor_note"]

STREAM_SHAPES = ((4096, 1, 8), (4096, 2, 8), (4096, 4, 8))  # (words a step, steps, warps)
GATHER_SHAPES = ((32, 1, 4), (16, 1, 2), (64, 1, 4))  # (rows a step, steps a program, warps)


def floor_note(shape: tuple, unit: str) -> str:
    """A floor record's note: the program shape that was fastest (``unit``: words or rows)."""
    n, steps, warps = shape
    return f"program={n} {unit} x {steps} steps, {warps} warps"


EVICT_POLICIES = ("", "evict_first")


def _check_evict(evict: object) -> None:
    if evict not in EVICT_POLICIES:
        raise ValueError(f"evict: expected one of {EVICT_POLICIES}, got {evict!r}")


def _fastest(calls, timers: dict, device) -> dict[str, tuple[float, tuple]]:
    """{timer name: (µs, shape)}: the fastest of ``calls`` ((shape, call) pairs) under each of
    ``timers`` ({name: timer(fn) → µs}), each call replayed from a CUDA graph on a GPU."""
    best = {}
    for shape, call in calls:
        fn = graphed(call) if torch.device(device).type == "cuda" else call
        for name, timer in timers.items():
            us = timer(fn)
            if name not in best or us < best[name][0]:
                best[name] = (us, shape)
    return best


def read_floor(n_bytes: int, timers: dict, device="cuda", shapes=STREAM_SHAPES,
               evict: str = "") -> dict[str, tuple[float, tuple]]:
    """The streaming read of ``n_bytes`` (int32 words, ones) at the fastest of ``shapes``
    under each of ``timers``: {name: (µs, (words a step, steps, warps))}; each program's count
    of words read checked. evict: the loads' L2 eviction policy ("" or "evict_first")."""
    check_int("n_bytes", n_bytes, lo=4)
    if n_bytes % 4:
        raise ValueError(f"n_bytes: expected a multiple of 4 (int32 words), got {n_bytes}")
    _check_evict(evict)
    n_words = n_bytes // 4
    x = torch.ones(n_words, dtype=torch.int32, device=device)
    calls, outs = [], []
    for block, steps, warps in shapes:
        grid = (triton.cdiv(n_words, block * steps),)
        outs.append(torch.empty(grid[0], dtype=torch.int32, device=device))
        calls.append(((block, steps, warps), functools.partial(
            _stream_read_kernel[grid], x, outs[-1], n_words, BLOCK=block, ITERS=steps,
            EVICT=evict, num_warps=warps, **OPTIONS)))
    best = _fastest(calls, timers, device)
    for (block, steps, _), out in zip(shapes, outs, strict=True):
        start = torch.arange(out.shape[0], device=device) * (block * steps)
        if not torch.equal(out, (n_words - start).clamp(max=block * steps).to(torch.int32)):
            raise RuntimeError("read floor: a program did not read its words once")
    return best


def gather_floor(rows: torch.Tensor, idx: torch.Tensor, timers: dict, device="cuda",
                 shapes=GATHER_SHAPES, evict: str = "") -> dict[str, tuple[float, tuple]]:
    """Every listed row read whole at the fastest of ``shapes`` under each of ``timers``:
    {name: (µs, (rows a step, steps, warps))}. rows: uint8 [pool, row_bytes] (contiguous;
    row_bytes a multiple of 16 and a sum of ≤ 3 powers of two as words — fp8_ds_mla's 656,
    fp8's 576); idx: int32 [lists, width], slots in [0, pool). Each program's sum is checked
    against its rows' (mod 2³²). Only the rows are read (a sparse case's q and out are not).
    evict: as `read_floor`'s."""
    check_tensor("rows", rows, dtype=torch.uint8, ndim=2)
    if rows.shape[1] % 16 or not rows.is_contiguous():
        raise ValueError(f"rows: expected contiguous rows of a multiple of 16 bytes, got "
                         f"{rows.shape[1]} bytes, strides {rows.stride()}")
    check_tensor("idx", idx, dtype=torch.int32, ndim=2)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= rows.shape[0]):
        raise ValueError(f"idx: expected slots in [0, {rows.shape[0]}), got "
                         f"{int(idx.min())}…{int(idx.max())}")
    _check_evict(evict)
    words = rows.view(torch.int32)
    r1, r2, r3 = word_runs(words.shape[1])
    lists, width = idx.shape
    listed = words.sum(dim=1, dtype=torch.int64)[idx.long()]  # [lists, width]
    calls, outs = [], []
    for n, steps, warps in shapes:
        grid = (lists, triton.cdiv(width, n * steps))
        outs.append(torch.empty(grid, dtype=torch.int32, device=device))
        calls.append(((n, steps, warps), functools.partial(
            _gather_read_kernel[grid], words, idx, outs[-1], width, R1=r1, R2=r2, R3=r3,
            ROWS=n, ITERS=steps, EVICT=evict, num_warps=warps, **OPTIONS)))
    best = _fastest(calls, timers, device)
    for (n, steps, _), out in zip(shapes, outs, strict=True):
        chunk = n * steps
        want = torch.nn.functional.pad(listed, (0, out.shape[1] * chunk - width))
        want = want.view(lists, out.shape[1], chunk).sum(dim=2)
        if torch.any((out.long() - want) % 2**32 != 0):
            raise RuntimeError("gather floor: a program's rows do not sum to its listed rows'")
    return best
