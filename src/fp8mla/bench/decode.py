"""Dense-decode benchmark cases (docs/DESIGN.md §6, §9 case names).

Bytes moved = KV rows read once (tokens × row bytes) + q + out; FLOPs = 2·heads·tokens·(576+512)
per query. Each case is checked against the float32 reference before it is timed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from fp8mla import reference
from fp8mla.bench.floors import floor_note, read_floor
from fp8mla.bench.harness import Record, graphed, kernel_note, time_us, time_us_clean_l2
from fp8mla.cache import build_block_table
from fp8mla.decode import DecodePlan, dense_decode
from fp8mla.formats import KV_DIM, LATENT_DIM, dequantize_kv, kv_format, quantize_kv
from fp8mla.runtime import DecodeConfig
from fp8mla.testing import assert_close

__all__ = ["DecodeCase", "DECODE_CASES", "POOL_CASE", "make_problem", "checked_plan", "run_case"]


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    context: int
    heads: int
    s_q: int = 1
    page_size: int = 64
    pool_tokens: int | None = None  # whole pool (≥ batch·context); the motivating case's 495K

    def name(self, kind: str, fmt: str) -> str:
        tail = f"-pool{self.pool_tokens}" if self.pool_tokens else f"-H{self.heads}"
        sq = f"-sq{self.s_q}" if self.s_q > 1 else ""
        # docs/DESIGN.md §9's cases use pages of 64 tokens; others are named (from session 11 on)
        page = f"-page{self.page_size}" if self.page_size != 64 else ""
        return f"{kind}/B{self.batch}-ctx{self.context}{tail}{sq}{page}"

    def kv_bytes(self, row_bytes: int) -> int:
        return self.batch * self.context * row_bytes

    def io_bytes(self) -> int:
        return self.batch * self.s_q * self.heads * (KV_DIM + LATENT_DIM) * 2

    def flops(self) -> int:
        return 2 * self.heads * self.s_q * self.batch * self.context * (KV_DIM + LATENT_DIM)


# docs/DESIGN.md §9's three cases, then MTP at 128 heads (DeepSeek-V3 with data-parallel attention:
# every head on each GPU; the 64-row kernels a program a query) and at 16 (s_q 2 × 16 heads:
# the 32-row programs `decode_config` tunes separately, which no §9 case reaches — on triton
# 3.8 the fp8 wide form in head blocks instead, `fp8mla.decode.SM90_MMA16_FP8_HEAD_BLOCKS`)
DECODE_CASES = [DecodeCase(64, 8192, 16), DecodeCase(1, 131072, 8), DecodeCase(64, 8192, 128),
                DecodeCase(64, 8192, 128, s_q=2), DecodeCase(64, 8192, 16, s_q=2)]
POOL_CASE = DecodeCase(1, 4096, 8, pool_tokens=495_000)


@functools.lru_cache(maxsize=4)
def make_problem(case: DecodeCase, fmt_name: str, device: str = "cuda", seed: int = 0):
    """Random pool (pages shuffled), block table, lengths and q for ``case`` (cached: a sweep
    reuses one problem)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    fmt = kv_format(fmt_name)
    ps = case.page_size
    pages_per_req = -(-case.context // ps)
    used = case.batch * pages_per_req
    num_pages = max(used, -(-(case.pool_tokens or 0) // ps))
    rows = torch.empty(num_pages * ps, fmt.row_bytes, dtype=torch.uint8, device=device)
    chunk = 1 << 18
    for i in range(0, rows.shape[0], chunk):
        n = min(chunk, rows.shape[0] - i)
        lat = torch.randn(n, LATENT_DIM, generator=g).to(device)
        rope = torch.randn(n, KV_DIM - LATENT_DIM, generator=g).to(device)
        rows[i:i + n] = quantize_kv(lat, rope, fmt, 0.02)
    perm = torch.randperm(num_pages, generator=g)[:used].view(case.batch, pages_per_req)
    table = build_block_table(perm.tolist(), device=device)
    seqlens = torch.full((case.batch,), case.context, dtype=torch.int32, device=device)
    q = (torch.randn(case.batch, case.s_q, case.heads, KV_DIM, generator=g) * 0.5).to(device)
    scale = torch.full((1,), 0.02, dtype=torch.float32, device=device)
    return fmt, rows.view(num_pages, ps, fmt.row_bytes), table, seqlens, q.to(torch.bfloat16), scale


def _check(case, fmt, rows, table, seqlens, q, scale, out, lse, max_check: int = 4) -> None:
    b = min(case.batch, max_check)
    kv = dequantize_kv(rows, fmt, scale)
    ro, rl = reference.dense_mla_decode(q[:b], kv, table[:b], seqlens[:b], KV_DIM ** -0.5)
    assert_close(out[:b], ro, name=f"{case} {fmt} out")
    assert_close(lse[:b], rl, atol=1e-3, rtol=1e-3, name=f"{case} {fmt} lse")


def checked_plan(case: DecodeCase, fmt_name: str, *, num_splits: int | None = None,
                 device: str = "cuda") -> tuple[DecodePlan, functools.partial]:
    """``case``'s plan (the launcher's configuration; ``num_splits`` or the scheduler's) and its
    call on the case's problem (`make_problem`), the call's result checked against the
    reference once: (plan, call)."""
    fmt, rows, table, seqlens, q, scale = make_problem(case, fmt_name, device)
    plan = DecodePlan(batch=case.batch, num_heads=case.heads, s_q=case.s_q, kv_format=fmt,
                      page_size=case.page_size, cache_seqlens=seqlens, device=device,
                      num_splits=num_splits)
    fn = functools.partial(plan.run, q, rows, table, seqlens, fp8_scale=scale, check=False)
    _check(case, fmt, rows, table, seqlens, q, scale, *fn())
    return plan, fn


def run_case(case: DecodeCase, fmt_name: str, env: dict, ceiling: float, *,
             backends=("fp8mla",), config: DecodeConfig | None = None,
             num_splits: int | None = None, kind: str | None = None,
             device: str = "cuda", floor: bool = False) -> list[Record]:
    """Check, then time ``case`` for each backend; one `Record` each. fp8mla is timed three
    times: eagerly (``fp8mla``: Python launch overhead included), replayed from a CUDA graph
    (``fp8mla_graph``: how a server runs decode), both with do_bench's flush (the targets'
    timer), and the replay after a flush that leaves the L2 clean (``fp8mla_graph_cleanL2``:
    as a serving step starts; `harness.l2_flushes`). Baselines run eagerly. floor: also the
    case's read floor (`floors.read_floor` of the bytes counted; backends ``read_floor``,
    ``read_floor_cleanL2``). device "cpu" (the interpreter: tests) times eagerly only."""
    fmt, rows, table, seqlens, q, scale = make_problem(case, fmt_name, device)
    records = []
    case_name = case.name(kind or f"dense_decode/{fmt_name}", fmt_name)
    moved = case.kv_bytes(fmt.row_bytes) + case.io_bytes()
    for backend in backends:
        if backend == "fp8mla":
            plan = DecodePlan(batch=case.batch, num_heads=case.heads, s_q=case.s_q,
                              kv_format=fmt, page_size=case.page_size, cache_seqlens=seqlens,
                              device=device, config=config, num_splits=num_splits)
            fn = lambda p=plan: p.run(q, rows, table, seqlens, fp8_scale=scale, check=False)
            note = kernel_note(plan)
            replay = graphed(fn) if device == "cuda" else None
            timed = [("fp8mla", fn, time_us)] + (
                [("fp8mla_graph", replay, time_us),
                 ("fp8mla_graph_cleanL2", replay, time_us_clean_l2)] if replay else [])
        else:
            fn = lambda b=backend: dense_decode(q, rows, table, seqlens, kv_format=fmt,
                                                fp8_scale=scale, backend=b, check=False)
            note, timed = None, [(backend, fn, time_us)]
        out, lse = fn()
        _check(case, fmt, rows, table, seqlens, q, scale, out, lse)
        for name, f, timer in timed:
            us = timer(f)
            records.append(Record(
                case=case_name, backend=name, us=round(us, 2),
                TBps=round(moved / (us * 1e-6) / 1e12, 3),
                TFLOPS=round(case.flops() / (us * 1e-6) / 1e12, 1),
                ceiling_TBps=round(ceiling, 3), note=note, **env))
    if floor:
        timers = {"read_floor": time_us}
        if device == "cuda":
            timers["read_floor_cleanL2"] = time_us_clean_l2
        for name, (us, shape) in read_floor(moved, timers, device).items():
            records.append(Record(case=case_name, backend=name, us=round(us, 2),
                                  TBps=round(moved / (us * 1e-6) / 1e12, 3), TFLOPS=None,
                                  ceiling_TBps=round(ceiling, 3),
                                  note=floor_note(shape, "words"), **env))
    return records
