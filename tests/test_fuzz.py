"""Property-based fuzzing of every public kernel against the float32 references.

Derandomized (CI-stable) with a bounded example count per kernel: FP8MLA_FUZZ_EXAMPLES
(default 10) raises it and FP8MLA_FUZZ_SCALE multiplies the size bounds, e.g. for a GPU run.
Inputs: random batch, s_q, heads, lengths (0 included), page sizes, shuffled block tables,
formats and scale policies, top-k widths and −1 patterns; unowned pages poisoned
(tests/helpers.py).
"""

import json
import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8mla import reference
from fp8mla import sparse as sparse_mod
from fp8mla.decode import DecodePlan
from fp8mla.formats import dequantize_index_keys, quantize_index_keys
from fp8mla.indexer import indexer_logits_ragged
from fp8mla.sparse import sparse_prefill
from fp8mla.testing import assert_close
from fp8mla.topk import topk_indices
from helpers import paged_cache, ragged_prefill_reference

EXAMPLES = int(os.environ.get("FP8MLA_FUZZ_EXAMPLES", "10"))
# FP8MLA_FUZZ_SCALE multiplies the size bounds (lengths, heads up to 128, top-k widths, row
# lengths): 1 under the interpreter, ~20 on a GPU for full-size shapes
SCALE = int(os.environ.get("FP8MLA_FUZZ_SCALE", "1"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOG = os.environ.get("FP8MLA_FUZZ_LOG")  # a file: one JSON line of sizes per example tried


def _log(kernel, **sizes):
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"kernel": kernel, **sizes}) + "\n")
FORMATS = st.sampled_from([("bf16", None), ("fp8", None), ("fp8_ds_mla", "pow2"),
                           ("fp8_ds_mla", "fp32")])


@FUZZ
@given(fmt=FORMATS, lens=st.lists(st.integers(0, 150 * SCALE), min_size=1, max_size=3),
       s_q=st.integers(1, 4), heads=st.integers(1, min(128, 20 * SCALE)),
       page_size=st.sampled_from([1, 2, 16, 64]), splits=st.sampled_from([None, 1, 3, 7]),
       seed=st.integers(0, 2**16))
def test_fuzz_dense_decode(fmt, lens, s_q, heads, page_size, splits, seed):
    _log("dense_decode", fmt=fmt, lens=lens, s_q=s_q, heads=heads, page_size=page_size,
         splits=splits)
    cache, table, seqlens, q = _dense_problem(fmt, lens, page_size, s_q, heads, seed)
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=page_size, cache_seqlens=seqlens, device=DEVICE,
                      num_splits=splits)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    _assert_dense(out, lse, q, cache, table, seqlens)


def _dense_problem(fmt, lens, page_size, s_q, heads, seed):
    """A poisoned paged cache of ``lens`` (`helpers.paged_cache`) and q [batch, s_q, heads,
    576]: (cache, block table, lengths, q)."""
    cache, table, seqlens = paged_cache(fmt[0], lens, page_size, policy=fmt[1], device=DEVICE,
                                        seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), s_q, heads, 576, generator=g).bfloat16().to(DEVICE)
    return cache, table, seqlens, q


def _assert_dense(out, lse, q, cache, table, seqlens):
    """out / lse as the reference's causal dense attention of q over the cache."""
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@FUZZ
@given(fmt=FORMATS, lens=st.lists(st.integers(0, 80 * SCALE), min_size=1, max_size=3),
       new=st.integers(1, 9), heads=st.integers(1, min(128, 12 * SCALE)),
       page_size=st.sampled_from([1, 16, 64]), entries=st.sampled_from([None, 1, 7]),
       ragged=st.one_of(st.none(), st.lists(st.integers(0, 9), min_size=3, max_size=3)),
       seed=st.integers(0, 2**16))
def test_fuzz_dense_prefill(fmt, lens, new, heads, page_size, entries, ragged, seed):
    """S new tokens a request (groups of up to four, the first padded), lengths below S and 0
    included, chunks of ``entries`` block-table entries (None: the default; 1: a group a
    chunk); queries that see nothing give 0 and lse −inf as the reference's. With ``ragged``,
    the packed form: request b's ragged[b] new tokens (0 included), `dense_prefill_ragged`."""
    from fp8mla import prefill

    news = None if ragged is None else ragged[:len(lens)]
    _log("dense_prefill", fmt=fmt, lens=lens, new=new, heads=heads, page_size=page_size,
         entries=entries, news=news)
    cache, table, seqlens, q = _dense_problem(fmt, lens, page_size, new, heads, seed)
    if news is not None:  # packed q: request b's news[b] tokens in order
        g = torch.Generator().manual_seed(seed + 2)
        q = torch.randn(sum(news), heads, 576, generator=g).bfloat16().to(DEVICE)
    saved = prefill.CHUNK_ENTRIES
    prefill.CHUNK_ENTRIES = saved if entries is None else entries * table.shape[1]
    try:
        if news is None:
            out, lse = prefill.dense_prefill(q, cache.layer(0), table, seqlens,
                                             kv_format=cache.fmt, fp8_scale=cache.scale(0))
        else:
            cu = torch.tensor([0] + news, device=DEVICE).cumsum(0).to(torch.int32)
            out, lse = prefill.dense_prefill_ragged(q, cu, cache.layer(0), table, seqlens,
                                                    kv_format=cache.fmt,
                                                    fp8_scale=cache.scale(0))
    finally:
        prefill.CHUNK_ENTRIES = saved
    if news is None:
        _assert_dense(out, lse, q, cache, table, seqlens)
        return
    ro, rl = ragged_prefill_reference(q, news, cache, table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@FUZZ
@given(fmt=FORMATS, tokens=st.integers(1, 4), heads=st.integers(1, min(128, 20 * SCALE)),
       topk=st.integers(1, 80 * SCALE), skip=st.floats(0, 1), seed=st.integers(0, 2**16),
       use_length=st.booleans(), compact=st.booleans(), outside=st.booleans())
def test_fuzz_sparse(fmt, tokens, heads, topk, skip, seed, use_length, compact, outside):
    """compact: the lists compacted first at any head count (the launcher: ≥ 64 heads per
    program, `fp8mla.sparse.COMPACT_MIN_ROWS`), else every entry checked in the loop — on the
    Triton kernel; where SM90's Gluon kernels serve (17+ heads sparse, on a GPU) they check
    every entry either way."""
    _log("sparse", fmt=fmt, tokens=tokens, heads=heads, topk=topk, skip=skip, compact=compact)
    saved = sparse_mod.COMPACT_MIN_ROWS
    sparse_mod.COMPACT_MIN_ROWS = 1 if compact else 1 << 30
    try:
        _fuzz_sparse(fmt, tokens, heads, topk, skip, seed, use_length, outside)
    finally:
        sparse_mod.COMPACT_MIN_ROWS = saved


def _fuzz_sparse(fmt, tokens, heads, topk, skip, seed, use_length, outside):
    """outside: some entries point past the pool, and the fast path (check=False) runs: it
    skips them, so the reference sees −1 there."""
    cache, _, _ = paged_cache(fmt[0], [40], 16, policy=fmt[1], device=DEVICE, seed=seed)
    g = torch.Generator().manual_seed(seed + 2)
    kv = cache.dequantize(0).reshape(-1, 576)
    live = torch.isfinite(kv).all(1).nonzero().flatten().cpu()  # the stored (unpoisoned) slots
    idx = live[torch.randint(0, len(live), (tokens, topk), generator=g)].to(torch.int32)
    idx[torch.rand(tokens, topk, generator=g) < skip] = -1
    lengths = torch.randint(0, topk + 1, (tokens,), generator=g, dtype=torch.int32) \
        if use_length else None
    q = torch.randn(tokens, heads, 576, generator=g).bfloat16().to(DEVICE)
    listed = idx.clone()
    if outside:
        far = torch.rand(tokens, topk, generator=g) < 0.1
        listed[far] = cache.num_slots + torch.randint(0, 1 << 20, (int(far.sum()),),
                                                      generator=g, dtype=torch.int32)
        idx[far] = -1
    out, lse = sparse_prefill(q, cache.layer(0), listed.to(DEVICE), kv_format=cache.fmt,
                              topk_length=None if lengths is None else lengths.to(DEVICE),
                              fp8_scale=cache.scale(0), check=not outside)
    ro, rl = reference.sparse_mla(q, kv, idx.to(DEVICE), 576 ** -0.5,
                                  None if lengths is None else lengths.to(DEVICE))
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@FUZZ
@given(rows=st.integers(1, 4), heads=st.integers(1, 64), seq=st.integers(1, 200 * SCALE),
       fp8_q=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_fuzz_indexer(rows, heads, seq, fp8_q, seed, data):
    _log("indexer", rows=rows, heads=heads, seq=seq, fp8_q=fp8_q)
    g = torch.Generator().manual_seed(seed)
    kb, ks = quantize_index_keys(torch.randn(seq, 128, generator=g),
                                 data.draw(st.sampled_from(["fp32", "pow2"])))
    q = torch.randn(rows, heads, 128, generator=g)
    q = q.to(torch.float8_e4m3fn) if fp8_q else q.bfloat16()
    w = torch.rand(rows, heads, generator=g)
    starts = torch.tensor([data.draw(st.integers(0, seq)) for _ in range(rows)], dtype=torch.int32)
    ends = torch.tensor([data.draw(st.integers(int(s), seq)) for s in starts], dtype=torch.int32)
    out = indexer_logits_ragged(q.to(DEVICE), w.to(DEVICE), kb.to(DEVICE), ks.to(DEVICE),
                                starts.to(DEVICE), ends.to(DEVICE))
    ref = reference.indexer_logits(q.float(), w, dequantize_index_keys(kb, ks), starts, ends)
    assert_close(out, ref, atol=1e-3, rtol=1e-3)


@FUZZ
@given(rows=st.integers(1, 3), length=st.integers(1, 3000 * SCALE), k=st.integers(1, min(2048, 300 * SCALE)),
       distinct=st.integers(0, 50), neg_inf=st.floats(0, 1), seed=st.integers(0, 2**16),
       chunk=st.sampled_from([None, 1024]))
def test_fuzz_topk(rows, length, k, distinct, neg_inf, seed, chunk):
    """distinct: that many values (ties), or 0: continuous (the sampled threshold's case)."""
    _log("topk", rows=rows, length=length, k=k, distinct=distinct, chunk=chunk)
    g = torch.Generator().manual_seed(seed)
    if distinct:
        x = torch.randint(0, distinct, (rows, length), generator=g).float() * 0.37 - 3.0
    else:
        x = torch.randn(rows, length, generator=g)
    x[torch.rand(rows, length, generator=g) < neg_inf] = float("-inf")
    out = topk_indices(x.to(DEVICE), k, chunk=chunk).cpu()
    ref = reference.topk_indices(x, k)
    for r in range(rows):
        assert set(out[r].tolist()) == set(ref[r].tolist())
