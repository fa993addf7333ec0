"""DSA benchmark cases: sparse decode, indexer logits, top-k (docs/DESIGN.md §6, §9 case names).

Byte and FLOP formulas:
- sparse decode: rows gathered once (B · s_q · topk × row bytes) + q + out;
  FLOPs 2 · H · topk · (576 + 512) per query.
- indexer: index-cache bytes (B · ctx × 132) — the figure the target is stated on — plus q,
  weights and the float32 logits written; FLOPs 2 · Hi · 128 · ctx per query.
- top-k: the logits read once (B · len × 4) + indices written; timed beside the indexer on the
  same rows (backend ``indexer``) so the ratio to the logits time is in the same run; eagerly
  and from CUDA-graph replays (``*_graph``, the graph ratio compared with the graph logits).
"""

from __future__ import annotations

import functools

import torch

from fp8mla import reference
from fp8mla.bench.floors import floor_note, gather_floor
from fp8mla.bench.harness import (
    Record,
    graphed,
    kernel_note,
    rate_record,
    time_us,
    time_us_clean_l2,
)
from fp8mla.cache import IndexKeyCache, build_block_table
from fp8mla.formats import KV_DIM, LATENT_DIM, dequantize_kv, kv_format, quantize_kv
from fp8mla.indexer import indexer_logits_paged
from fp8mla.runtime import target_for
from fp8mla.sparse import SparsePlan
from fp8mla.testing import assert_close
from fp8mla.topk import default_chunk, topk_indices

__all__ = ["SPARSE_CASES", "PREFILL_CASES", "INDEXER_CASES", "TOPK_CASES", "run_sparse",
           "run_indexer_topk", "sparse_problem", "check_sparse", "checked_sparse_plan"]

SPARSE_CASES = [(128, 128, 2048, 1), (128, 128, 2048, 2), (64, 64, 2048, 1), (64, 8, 2048, 1)]
# sparse prefill (no target in the issue; what a prompt's attention costs): (tokens, heads,
# topk) — DeepSeek-V3.2's 128 heads on one GPU, GLM-5's 8 at TP8 — over the same pool, each
# token its own list
PREFILL_CASES = [(4096, 128, 2048), (4096, 8, 2048)]
INDEXER_CASES = [(64, 32768, 32), (64, 32768, 64)]
# B=1 × 4160: the demo's row (a 65-page table at ctx 4096), timed from a graph like the others
TOPK_CASES = [(1, 4160, 2048), (64, 32768, 2048), (64, 131072, 2048)]
# top-k also timed with one program per row (chunk 0) and the chunk sizes other than the
# default (`fp8mla.topk.default_chunk`) that split the row
TOPK_CHUNKS = (0, 1024, 2048, 4096)
POOL_TOKENS = 1 << 20


def _timed(fn, device):
    """A CUDA graph replay of fn on the GPU (fn itself elsewhere: CPU smoke runs)."""
    return graphed(fn) if torch.device(device).type == "cuda" else fn


def sparse_problem(batch, heads, topk, s_q, fmt, device, pool_tokens=POOL_TOKENS, seed=None):
    """The sparse case's inputs: (pool rows uint8 [pool_tokens, row_bytes], index lists int32
    [batch · s_q, topk] drawn uniformly over the pool, q bfloat16 [batch · s_q, heads, 576]);
    ``seed`` defaults to one per shape."""
    g = torch.Generator().manual_seed(batch * heads + s_q if seed is None else seed)
    rows = torch.empty(pool_tokens, fmt.row_bytes, dtype=torch.uint8, device=device)
    for i in range(0, pool_tokens, 1 << 18):
        n = min(1 << 18, pool_tokens - i)
        rows[i:i + n] = quantize_kv(torch.randn(n, LATENT_DIM, generator=g).to(device),
                                    torch.randn(n, KV_DIM - LATENT_DIM, generator=g).to(device),
                                    fmt)
    t = batch * s_q
    idx = torch.randint(0, pool_tokens, (t, topk), generator=g, dtype=torch.int32).to(device)
    q = torch.randn(t, heads, KV_DIM, generator=g).bfloat16().to(device)
    return rows, idx, q


def check_sparse(out, q, rows, idx, fmt, queries: int = 2) -> None:
    """The first ``queries`` queries' outputs (``out`` bfloat16 [queries · s_q, heads, 512]) of
    `sparse_problem`'s inputs against the float32 softmax over the rows each lists."""
    n = min(q.shape[0], queries)
    kv = dequantize_kv(rows[idx[:n].flatten().long()], fmt).view(n, idx.shape[1], KV_DIM)
    for r in range(n):
        s = (q[r].float() @ kv[r].T) * KV_DIM ** -0.5
        assert_close(out[r], torch.softmax(s, -1) @ kv[r][:, :LATENT_DIM], name="sparse out")


def checked_sparse_plan(batch, heads, topk, s_q=1, fmt_name="fp8_ds_mla", *, device="cuda",
                        pool_tokens=POOL_TOKENS, config=None, num_splits=None):
    """The sparse case's plan (the launcher's configuration, or ``config`` / ``num_splits``)
    and its call on `sparse_problem`'s inputs, the first queries checked against the reference
    once: (case name, plan, call)."""
    return _checked_problem(batch, heads, topk, s_q, fmt_name, device, pool_tokens, config,
                            num_splits)[:3]


def _checked_problem(batch, heads, topk, s_q, fmt_name, device, pool_tokens, config,
                     num_splits, prefill=False):
    """`checked_sparse_plan`'s (case name, plan, call), then the problem's rows and lists;
    ``prefill``: named as a prefill of ``batch`` tokens (s_q 1)."""
    fmt = kv_format(fmt_name)
    rows, idx, q = sparse_problem(batch, heads, topk, s_q, fmt, device, pool_tokens)
    plan = SparsePlan(num_queries=batch * s_q, num_heads=heads, topk=topk, kv_format=fmt,
                      device=device, config=config, num_splits=num_splits)
    fn = functools.partial(plan.run, q, rows, idx, check=False)
    check_sparse(fn()[0], q, rows, idx, fmt)
    name = (f"sparse_prefill/{fmt_name}/T{batch}-H{heads}-topk{topk}" if prefill
            else f"sparse_decode/{fmt_name}/B{batch}-H{heads}-topk{topk}-sq{s_q}")
    return name, plan, fn, rows, idx


def sparse_bytes(batch, heads, topk, s_q, row_bytes) -> int:
    """Bytes a sparse decode case moves: the listed rows gathered once, q and out."""
    t = batch * s_q
    return t * topk * row_bytes + t * heads * (KV_DIM + LATENT_DIM) * 2


def run_sparse(batch, heads, topk, s_q, env, ceiling, fmt_name="fp8_ds_mla", *,
               device="cuda", pool_tokens=POOL_TOKENS, config=None,
               num_splits=None, floor=False, prefill=False) -> list[Record]:
    """Sparse decode over a 1M-slot pool with random indices; checked, then timed from a CUDA
    graph. config / num_splits: override the launcher's (benchmarks/sparse_variants.py).
    prefill: the case is ``batch`` prompt tokens (s_q 1; named `sparse_prefill/...`), the
    same kernels and formulas.
    floor: also the gather floor of the same rows and lists (`floors.gather_floor`; backends
    ``gather_floor``, ``gather_floor_cleanL2``; TB/s on the rows it reads, q and out not)."""
    case, plan, fn, rows, idx = _checked_problem(batch, heads, topk, s_q, fmt_name, device,
                                                 pool_tokens, config, num_splits, prefill)
    replay = _timed(fn, device)
    moved = sparse_bytes(batch, heads, topk, s_q, plan.fmt.row_bytes)
    flops = 2 * heads * topk * (KV_DIM + LATENT_DIM) * batch * s_q
    note = kernel_note(plan)
    records = [rate_record(case, "fp8mla_graph", time_us(replay), moved, flops, ceiling, env,
                       note=note)]
    cuda = torch.device(device).type == "cuda"
    if cuda:  # the same replay with a clean L2 (`run_case`)
        records.append(rate_record(case, "fp8mla_graph_cleanL2", time_us_clean_l2(replay), moved,
                               flops, ceiling, env, note=note))
    if floor:
        timers = {"gather_floor": time_us}
        if cuda:
            timers["gather_floor_cleanL2"] = time_us_clean_l2
        listed = batch * s_q * topk * plan.fmt.row_bytes
        for name, (us, shape) in gather_floor(rows, idx, timers, device).items():
            records.append(rate_record(case, name, us, listed, None, ceiling, env,
                                   note=floor_note(shape, "rows") + " (rows only)"))
    return records


def _index_problem(batch, ctx, heads, device, page_size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    pages = -(-ctx // page_size)  # the table covers every position below ctx
    cache = IndexKeyCache(batch * pages, page_size, device=device)
    perm = torch.randperm(batch * pages, generator=g).view(batch, pages)
    table = build_block_table(perm.tolist(), device=device)
    keys = torch.randn(batch * pages * page_size, 128, generator=g).bfloat16().to(device)
    cache.store(0, keys, torch.arange(batch * pages * page_size, device=device), check=False)
    q = torch.randn(batch, 1, heads, 128, generator=g).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(batch, heads, generator=g).to(device)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    return cache, table, q, w, lens


def _indexer_case(batch, ctx, heads, env, ceiling, device) -> list[Record]:
    cache, table, q, w, lens = _index_problem(batch, ctx, heads, device)
    fn = lambda: indexer_logits_paged(q, w, cache.layer(0), table, lens, max_len=ctx,
                                      check=False)
    out = fn()
    first = (table[0, :, None].long() * 64 + torch.arange(64, device=device)).flatten()
    ref = reference.indexer_logits(q[0].float(), w[:1], cache.dequantize(0)[first],
                                   torch.tensor([0]), torch.tensor([ctx]))
    assert_close(out[:1], ref, atol=1e-3, rtol=1e-3, name="indexer")
    # eager, and replayed from a CUDA graph (`fp8mla_graph`): the eager call's Python path is
    # about as long as this kernel, so the eager row can measure the host (BENCHMARKS.md)
    return [rate_record(f"indexer/fp8/B{batch}-ctx{ctx}-Hi{heads}", "fp8mla" + suffix,
                    time_us(wrap(fn)), batch * ctx * 132, 2 * heads * 128 * ctx * batch,
                    ceiling, env, note="TB/s on index-cache bytes only; + logits written "
                                       f"{batch * ctx * 4 / 1e6:.0f} MB")
            for suffix, wrap in (("", lambda f: f), ("_graph", lambda f: _timed(f, device)))]


def topk_reference(logits: torch.Tensor, k: int) -> torch.Tensor:
    """`topk_indices`' answer for rows of at least k finite logits, fast on a GPU: a stable
    descending sort applies the tie rule (lower positions first); positions ascending, int32."""
    return torch.sort(logits, dim=1, descending=True, stable=True).indices[:, :k].int().sort(
        1).values


def _topk_case(batch, length, k, env, ceiling, device) -> list[Record]:
    cache, table, q, w, lens = _index_problem(batch, length, 32, device, seed=1)
    logits_fn = lambda: indexer_logits_paged(q, w, cache.layer(0), table, lens, max_len=length,
                                             check=False)
    logits = logits_fn()
    topk_fn = lambda: topk_indices(logits, k)
    ref = topk_reference(logits, k)  # every row
    assert torch.equal(topk_fn(), ref), "top-k differs from the stable-sort reference"
    case = f"topk/B{batch}-len{length}-k{k}"
    # eager (docs/DESIGN.md §9's `indexer` / `fp8mla`) and CUDA-graph replays (`*_graph`: how a
    # decode step runs them; a one-row top-k is shorter than its Python launch path)
    moved = batch * length * 4 + batch * k * 4
    records = []
    for suffix, wrap in (("", lambda fn: fn), ("_graph", lambda fn: _timed(fn, device))):
        us_logits, us_topk = time_us(wrap(logits_fn)), time_us(wrap(topk_fn))
        records += [rate_record(case, "indexer" + suffix, us_logits, batch * length * 132,
                            2 * 32 * 128 * length * batch, ceiling, env),
                    rate_record(case, "fp8mla" + suffix, us_topk, moved, None, ceiling, env,
                            note=f"{us_topk / us_logits:.2f} x the logits time")]
    default = default_chunk(batch, length, target_for(logits.device).num_sms)
    for chunk in TOPK_CHUNKS:  # topk_indices(chunk=...): 0 one program per row, else several
        if chunk != default and (chunk == 0 or length > chunk):
            fn = lambda c=chunk: topk_indices(logits, k, chunk=c)  # noqa: E731
            assert torch.equal(fn(), ref), f"chunk {chunk}: top-k differs"
            us = time_us(_timed(fn, device))
            records.append(rate_record(case, f"fp8mla_graph_chunk{chunk}", us, moved, None,
                                   ceiling, env, note=f"{us / us_logits:.2f} x the logits time"))
    return records


def run_indexer_topk(env, ceiling, *, device="cuda", indexer_cases=INDEXER_CASES,
                     topk_cases=TOPK_CASES) -> list[Record]:
    """Indexer cases, then top-k cases with the logits time of the same rows beside them."""
    records = [r for c in indexer_cases for r in _indexer_case(*c, env, ceiling, device)]
    for c in topk_cases:
        records += _topk_case(*c, env, ceiling, device)
    return records
