"""Dense-prefill benchmark cases (`fp8mla.prefill.dense_prefill`, `dense_prefill_ragged`; no
target in the issues: what a prompt's attention costs).

A case is S new tokens of each of B requests over contexts of ``ctx`` tokens (S of them new:
a fresh prompt where ctx = S); a ragged case gives each request its own S, packed (an engine's
batch of prompts and prefix-cache hits), and is timed also as `dense_prefill` a request at a
time (backend ``per_request``: what a caller without the packed form does). FLOPs = 2 · heads ·
Σ visible tokens · (576 + 512); bytes = the cached rows each group of new tokens reads once
(`fp8mla.prefill.query_groups`, `ragged_groups`) + q + out. Each case is checked against the
float32 reference (request 0's first four queries and its last four; a ragged case's, each
request's) before it is timed, eagerly (with check=False a call reads nothing on the
host, but it builds its plans: it is not graphed).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from fp8mla import reference
from fp8mla.bench.decode import DecodeCase, make_problem
from fp8mla.bench.harness import Record, rate_record, time_us
from fp8mla.formats import KV_DIM, LATENT_DIM, dequantize_kv
from fp8mla.prefill import (
    GROUP,
    dense_prefill,
    dense_prefill_ragged,
    query_groups,
    ragged_group_size,
    ragged_groups,
)
from fp8mla.testing import assert_close

__all__ = ["PrefillCase", "PREFILL_CASES", "RaggedPrefillCase", "RAGGED_CASES", "prefill_problem",
           "run_prefill", "run_ragged_prefill"]


@dataclass(frozen=True)
class PrefillCase:
    batch: int
    new: int  # S new tokens a request
    context: int  # its length with them
    heads: int

    def name(self, fmt: str) -> str:
        return f"dense_prefill/{fmt}/B{self.batch}-S{self.new}-ctx{self.context}-H{self.heads}"

    def visible(self) -> int:
        """Σ over the new tokens of the tokens each sees."""
        return self.batch * sum(max(0, self.context - self.new + 1 + i)
                                for i in range(self.new))

    def flops(self) -> int:
        return 2 * self.heads * self.visible() * (KV_DIM + LATENT_DIM)

    def io_bytes(self) -> int:
        return self.batch * self.new * self.heads * (KV_DIM + LATENT_DIM) * 2


# a 4K-token prompt at DeepSeek-V3's 16 heads a GPU (TP8) and at 128 (TP1 / data-parallel
# attention), fp8 rows in pages of 64
PREFILL_CASES = [PrefillCase(1, 4096, 4096, 16), PrefillCase(1, 4096, 4096, 128)]


@dataclass(frozen=True)
class RaggedPrefillCase:
    news: tuple[int, ...]  # each request's new tokens
    context: int  # each request's length with them
    heads: int

    def name(self, fmt: str) -> str:
        return (f"dense_prefill_ragged/{fmt}/B{len(self.news)}-S{'+'.join(map(str, self.news))}"
                f"-ctx{self.context}-H{self.heads}")

    def flops(self) -> int:
        return sum(PrefillCase(1, s, self.context, self.heads).flops() for s in self.news)

    def io_bytes(self) -> int:
        return sum(self.news) * self.heads * (KV_DIM + LATENT_DIM) * 2


# 16 heads (DeepSeek-V3 at TP8): a 4K prompt beside prefix-cache hits of 2K, 1K and 7 new
# tokens (its first group padded) over 4K-token contexts
RAGGED_CASES = [RaggedPrefillCase((4096, 2048, 1024, 7), 4096, 16)]


def prefill_problem(case: PrefillCase, fmt_name: str, device: str = "cuda"):
    """``case``'s pool, block table and lengths (`fp8mla.bench.decode.make_problem`'s, pages
    of 64) and its new tokens' q, bfloat16 [batch, S, heads, 576]: (fmt, pages, table,
    seqlens, q, fp8 scale)."""
    fmt, pages, table, seqlens, _, scale = make_problem(
        DecodeCase(case.batch, case.context, case.heads), fmt_name, device)
    g = torch.Generator(device="cpu").manual_seed(case.new + case.heads)
    q = torch.randn(case.batch, case.new, case.heads, KV_DIM, generator=g) * 0.5
    return fmt, pages, table, seqlens, q.to(torch.bfloat16).to(device), scale


def run_prefill(case: PrefillCase, fmt_name: str, env: dict, ceiling: float,
                device: str = "cuda") -> list[Record]:
    """Check, then time ``case`` on `dense_prefill` (backend ``fp8mla``): one `Record`."""
    fmt, pages, table, seqlens, q, scale = prefill_problem(case, fmt_name, device)
    fn = functools.partial(dense_prefill, q, pages, table, seqlens, kv_format=fmt,
                           fp8_scale=scale, check=False)
    out, _ = fn()
    kv = dequantize_kv(pages, fmt, scale)
    k = min(4, case.new)
    for first in (True, False):  # request 0's first k queries, then its last k
        q_k, lens = (q[:1, :k], seqlens[:1] - (case.new - k)) if first else (q[:1, -k:],
                                                                             seqlens[:1])
        ro, _ = reference.dense_mla_decode(q_k, kv, table[:1], lens, KV_DIM ** -0.5)
        got = out[:1, :k] if first else out[:1, -k:]
        assert_close(got, ro, name=f"{case} {fmt_name} out ({'first' if first else 'last'} "
                     f"{k} queries)")
    group = min(case.new, GROUP)
    rows = int(query_groups(seqlens, case.new, group).long().sum())
    moved = rows * fmt.row_bytes + case.io_bytes()
    return [rate_record(case.name(fmt_name), "fp8mla", time_us(fn), moved, case.flops(),
                        ceiling, env, note=f"groups of {group}")]


def run_ragged_prefill(case: RaggedPrefillCase, fmt_name: str, env: dict, ceiling: float,
                       device: str = "cuda") -> list[Record]:
    """Check, then time ``case`` on `dense_prefill_ragged` (backend ``fp8mla``) and on
    `dense_prefill` a request at a time (``per_request``): two `Record` s."""
    b, t = len(case.news), sum(case.news)
    fmt, pages, table, seqlens, _, scale = make_problem(
        DecodeCase(b, case.context, case.heads), fmt_name, device)
    g = torch.Generator(device="cpu").manual_seed(t + case.heads)
    q = (torch.randn(t, case.heads, KV_DIM, generator=g) * 0.5).to(torch.bfloat16).to(device)
    cu = torch.tensor((0,) + case.news, device=device).cumsum(0).to(torch.int32)
    fn = functools.partial(dense_prefill_ragged, q, cu, pages, table, seqlens, kv_format=fmt,
                           fp8_scale=scale, check=False)
    out, _ = fn()
    kv = dequantize_kv(pages, fmt, scale)
    starts = [0] + cu[1:-1].tolist()
    for r, (a, s) in enumerate(zip(starts, case.news, strict=True)):
        k = min(4, s)  # each request's first and last (up to) four queries
        for at, seen in ((a, case.context - (s - k)), (a + s - k, case.context)):
            ro, _ = reference.dense_mla_decode(
                q[None, at:at + k], kv, table[r:r + 1],
                torch.full((1,), seen, dtype=torch.int32, device=device), KV_DIM ** -0.5)
            assert_close(out[None, at:at + k], ro, name=f"{case} {fmt_name} out (request {r}'s "
                         f"queries {at - a}–{at - a + k - 1})")
    group = ragged_group_size(t, b)
    rows = int(ragged_groups(cu, seqlens, t, group)[1].long().sum())
    moved = rows * fmt.row_bytes + case.io_bytes()

    def per_request():
        for r, (a, s) in enumerate(zip(starts, case.news, strict=True)):
            dense_prefill(q[None, a:a + s], pages, table[r:r + 1], seqlens[r:r + 1],
                          kv_format=fmt, fp8_scale=scale, check=False)

    return [rate_record(case.name(fmt_name), backend, time_us(call), moved, case.flops(),
                        ceiling, env, note=note)
            for backend, call, note in (
                ("fp8mla", fn, f"groups of {group}"),
                ("per_request", per_request, "dense_prefill a request at a time"))]
