"""Sparse MLA decode/prefill against the float32 reference: every format, odd head counts and
widths, −1 anywhere, duplicates, topk_length, never-listed slots poisoned — each through both
ways the attention kernel reads index lists (checked per entry; compacted first)."""

import pytest
import torch

from fp8mla import reference
from fp8mla import sparse as sparse_mod
from fp8mla.cache import PagedKVCache
from fp8mla.kernels.compact import _compact_indices_kernel
from fp8mla.sparse import SparsePlan, sparse_decode, sparse_prefill
from fp8mla.testing import assert_close
from helpers import LaunchRecorder, poison, sparse_lists, sparse_pool


@pytest.fixture(params=["checked", "compacted"])
def index_path(request, monkeypatch):
    """Every plan of the test checks each index entry in the attention loop, or compacts the
    lists first (`fp8mla.sparse.COMPACT_MIN_ROWS`: the default picks by head count)."""
    monkeypatch.setattr(sparse_mod, "COMPACT_MIN_ROWS", 1 << 30 if request.param == "checked"
                        else 1)
    return request.param

FORMATS = [("bf16", None), ("fp8", None), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")]


def _problem(fmt, policy, tokens, heads, topk, device, *, page_size=16, seed=0):
    """A poisoned pool where only the listed slots hold data; index lists with −1 and
    duplicates."""
    g = torch.Generator().manual_seed(seed)
    cache, live = sparse_pool(fmt, policy, 8, page_size, device, g)
    idx = sparse_lists(live, tokens, topk, g)
    q = torch.randn(tokens, heads, 576, generator=g).bfloat16()
    return cache, idx.to(device), q.to(device)


def _ref(cache, q, idx, scale, lengths=None):
    kv = cache.dequantize(0).reshape(-1, 576)
    return reference.sparse_mla(q, kv, idx, scale, lengths)


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("tokens,heads,topk", [(3, 1, 1), (2, 3, 7), (4, 8, 64), (1, 64, 33),
                                               (2, 128, 16)])
def test_sparse_prefill_matches_reference(device, index_path, fmt, policy, tokens, heads, topk):
    cache, idx, q = _problem(fmt, policy, tokens, heads, topk, device, seed=heads + topk)
    out, lse = sparse_prefill(q, cache.layer(0), idx, kv_format=cache.fmt, softmax_scale=0.07,
                              fp8_scale=cache.scale(0))
    ro, rl = _ref(cache, q, idx, 0.07)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8"])
def test_sparse_decode_with_topk_length_and_splits(device, index_path, fmt):
    cache, idx, q = _problem(fmt, None, 6, 8, 100, device, page_size=1, seed=5)
    lengths = torch.tensor([100, 0, 37], dtype=torch.int32, device=device)
    out, lse = sparse_decode(q.view(3, 2, 8, 576), cache.layer(0), idx.view(3, 2, 100),
                             kv_format=fmt, topk_length=lengths, fp8_scale=cache.scale(0))
    ro, rl = _ref(cache, q, idx, 576 ** -0.5, lengths.repeat_interleave(2))
    assert_close(out.view(6, 8, 512), ro, name="out")
    assert_close(lse.view(6, 8), rl, atol=1e-3, rtol=1e-3, name="lse")
    assert torch.all(lse[1] == float("-inf")) and torch.all(out[1] == 0)
    for splits in (1, 3):
        plan = SparsePlan(num_queries=6, num_heads=8, topk=100, kv_format=fmt, device=device,
                          num_splits=splits)
        o2, _ = plan.run(q, cache.layer(0), idx, lengths.repeat_interleave(2),
                         fp8_scale=cache.scale(0))
        assert_close(o2, ro, name=f"{splits} splits")
        # max_logits: the largest scaled score per (query, head), −inf with no valid index
        kv = cache.dequantize(0).reshape(-1, 576)
        for t, n in enumerate(lengths.repeat_interleave(2).tolist()):
            sel = idx[t, :n].long()
            sel = sel[sel >= 0]
            want = ((q[t].float() @ kv[sel].T) * 576 ** -0.5).amax(-1) if len(sel) else \
                torch.full((8,), float("-inf"), device=device)
            assert_close(plan.max_logits[t, 0], want, atol=1e-3, rtol=1e-3, name="max_logits")


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
def test_sparse_indices_two_tiles_ahead(device, index_path, fmt):
    """DecodeConfig.lookahead = 2 at 3 stages (index entries loaded two tiles ahead): lists of
    several tiles with −1 and duplicates, topk_length shorter than the list (mid-tile) and
    zero, against the reference over a poisoned pool."""
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    cache, idx, q = _problem(fmt, None, 3, 8, 150, device, page_size=1, seed=7)
    lengths = torch.tensor([150, 70, 0], dtype=torch.int32, device=device)
    cfg = replace(decode_config(90, fmt, 8, 1, sparse=True), block_n=32, num_stages=3,
                  lookahead=2)
    plan = SparsePlan(num_queries=3, num_heads=8, topk=150, kv_format=fmt, device=device,
                      num_splits=2, config=cfg)
    out, lse = plan.run(q, cache.layer(0), idx, lengths, fp8_scale=cache.scale(0))
    ro, rl = _ref(cache, q, idx, 576 ** -0.5, lengths)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


def test_one_slot_pool(device, index_path):
    """A pool of one row: Triton compiles an int argument equal to 1 as a constant, which the
    kernel's index check must accept (a `.to()` on it failed to compile in session 9)."""
    cache = PagedKVCache(1, 1, "fp8_ds_mla", device=device)
    poison(cache)
    g = torch.Generator().manual_seed(3)
    cache.store(0, torch.randn(1, 512, generator=g).bfloat16().to(device),
                torch.randn(1, 64, generator=g).bfloat16().to(device),
                torch.tensor([0], device=device))
    q = torch.randn(2, 1, 4, 576, generator=g).bfloat16().to(device)
    idx = torch.tensor([[[0, -1, 0]], [[-1, -1, -1]]], dtype=torch.int32, device=device)
    out, lse = sparse_decode(q, cache.layer(0), idx, kv_format="fp8_ds_mla")
    ro, rl = _ref(cache, q.view(2, 4, 576), idx.view(2, 3), 576 ** -0.5)
    assert_close(out.view(2, 4, 512), ro, name="out")
    assert_close(lse.view(2, 4), rl, atol=1e-3, rtol=1e-3, name="lse")


def test_all_skipped_gives_zeros_and_minus_inf(device, index_path):
    cache, idx, q = _problem("fp8_ds_mla", None, 2, 4, 8, device)
    idx[0] = -1
    out, lse = sparse_prefill(q, cache.layer(0), idx, kv_format="fp8_ds_mla")
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))


def test_out_of_range_indices(device, index_path):
    cache, idx, q = _problem("fp8", None, 2, 4, 8, device)
    bad = idx.clone()
    bad[1, 3] = cache.num_slots
    with pytest.raises(ValueError, match=r"indices: expected slots in \[-1, 128\).*got 128"):
        sparse_prefill(q, cache.layer(0), bad, kv_format="fp8")
    # the fast path treats it as −1 (never reads outside the pool)
    out, _ = sparse_prefill(q, cache.layer(0), bad, kv_format="fp8", check=False)
    skip = idx.clone()
    skip[1, 3] = -1
    ref, _ = sparse_prefill(q, cache.layer(0), skip, kv_format="fp8")
    assert torch.equal(out, ref)


def test_fast_path_reads_no_further_than_the_list(device, index_path):
    """check=False trusts topk_length but never reads past a query's list: a length beyond
    topk counts topk entries (reading on would take the next query's list)."""
    cache, idx, q = _problem("fp8_ds_mla", None, 2, 8, 8, device, seed=4)
    plan = SparsePlan(num_queries=2, num_heads=8, topk=8, kv_format="fp8_ds_mla",
                      device=device)
    full = torch.tensor([8, 8], dtype=torch.int32, device=device)
    want, want_lse = (t.clone() for t in plan.run(q, cache.layer(0), idx, full))
    past = torch.tensor([16, 8 + 1000], dtype=torch.int32, device=device)
    out, lse = plan.run(q, cache.layer(0), idx, past, check=False)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_compacted_entries_past_the_count_are_never_read(device):
    """The compacted buffer holds a NaN-poisoned slot everywhere before the run: only the
    first `count` entries of each list may be read."""
    cache, idx, q = _problem("fp8", None, 3, 64, 150, device, page_size=1, seed=8)
    plan = SparsePlan(num_queries=3, num_heads=64, topk=150, kv_format="fp8", device=device,
                      num_splits=2)
    assert not plan.checks_indices
    stored = torch.zeros(cache.num_slots, dtype=torch.bool)
    stored[idx[idx >= 0].long().cpu()] = True
    plan._kept.fill_(int((~stored).nonzero()[0]))  # a slot never written: poisoned
    lengths = torch.tensor([150, 40, 0], dtype=torch.int32, device=device)
    out, lse = plan.run(q, cache.layer(0), idx, lengths, fp8_scale=cache.scale(0))
    ro, rl = _ref(cache, q, idx, 576 ** -0.5, lengths)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


def test_compaction_keeps_valid_entries_in_order(device):
    """`_compact_indices_kernel` over lists of several blocks: −1, other negatives, slots at and
    past the pool's end, lengths past the width, zero and negative; the valid entries land in
    order at the front, the count beside them, and nothing past the count is written."""
    g = torch.Generator().manual_seed(11)
    topk, num_slots = 100, 90
    idx = torch.randint(-5, 110, (6, topk), generator=g, dtype=torch.int32)
    idx[2] = -1
    lens = torch.tensor([100, 0, 100, 37, 150, -3], dtype=torch.int32)
    out = torch.full_like(idx, 12345)
    count = torch.full((6,), -9, dtype=torch.int32)
    idx, lens, out, count = (t.to(device) for t in (idx, lens, out, count))
    _compact_indices_kernel[(6,)](idx, lens, out, count, topk, topk, topk, num_slots, BLOCK=16)
    for t in range(6):
        row = idx[t, :max(0, min(int(lens[t]), topk))]
        want = row[(row >= 0) & (row < num_slots)]
        assert int(count[t]) == len(want), t
        assert torch.equal(out[t, :len(want)], want), t
        assert torch.all(out[t, len(want):] == 12345), t


def test_compaction_rule(device):
    """64-row programs (64 heads and more) attend to compacted lists, fewer rows check every
    entry (measured on the H200: `fp8mla.sparse.COMPACT_MIN_ROWS`); the Gluon SM90 kernels check
    every entry themselves, so no plan they serve compacts (nor holds the compacted lists)."""
    for heads in (8, 32, 64, 128):
        plan = SparsePlan(num_queries=2, num_heads=heads, topk=40, kv_format="fp8_ds_mla",
                          device=device)
        checks = plan.config.heads_per_block < 64  # 64 rows on SM80 / SM90 and the interpreter
        assert plan.checks_indices == checks, heads
        assert plan.compacts == (not checks and not plan.sm90), heads
        assert hasattr(plan, "_kept") == plan.compacts, heads
        if plan.target.cc in (80, 90) and heads >= 64:
            assert not checks


def test_bad_sparse_arguments(device):
    cache, idx, q = _problem("fp8", None, 2, 4, 8, device)
    plan = SparsePlan(num_queries=2, num_heads=4, topk=8, kv_format="fp8", device=device)
    with pytest.raises(ValueError, match=r"indices: expected shape \[2, 8\], got \[2, 7\]"):
        plan.run(q, cache.layer(0), idx[:, :7].contiguous())
    with pytest.raises(TypeError, match=r"indices: expected dtype int32, got int64"):
        plan.run(q, cache.layer(0), idx.long())
    with pytest.raises(ValueError, match=r"topk_length: expected values in \[0, 8\]"):
        plan.run(q, cache.layer(0), idx, torch.tensor([9, 1], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"q: expected shape \[2, 4, 576\]"):
        plan.run(q[:, :3].contiguous(), cache.layer(0), idx)
    with pytest.raises(ValueError, match=r"fp8_scale: expected a finite value > 0, got 0.0"):
        plan.run(q, cache.layer(0), idx, fp8_scale=torch.zeros(1, device=device))
    with pytest.raises(ValueError, match=r"^num_queries: expected an int in \[1, inf\], got 0"):
        SparsePlan(num_queries=0, num_heads=4, topk=8, kv_format="fp8", device=device)
    every_other = torch.tensor([8, 0, 8, 0], dtype=torch.int32, device=device)[::2]
    with pytest.raises(ValueError, match=r"topk_length: expected a contiguous last dimension"):
        plan.run(q, cache.layer(0), idx, every_other)  # the kernels read it with unit stride


def test_gluon_sparse_plan_refuses_a_misaligned_pool(monkeypatch):
    """SM90's Gluon sparse kernels copy rows 16 bytes at a time and their plans hold no
    compacted lists for the Triton kernel to fall back on: a pool whose first row is not
    16-byte aligned is refused with an error naming kv_cache, before any launch (the target
    faked as SM90 on the CPU; the aligned pool reaches the launch, recorded, not run)."""
    import fp8mla.decode as decode_mod
    from fp8mla.kernels import decode_sm90
    from fp8mla.runtime import Target

    if not decode_sm90.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))
    launches = []
    monkeypatch.setattr(decode_sm90, "_mla_sparse_sm90_kernel", LaunchRecorder(launches))
    monkeypatch.setattr(decode_mod, "_combine_splits_kernel", LaunchRecorder(launches))
    plan = SparsePlan(num_queries=2, num_heads=32, topk=64, kv_format="fp8_ds_mla",
                      device="cpu")
    assert plan.sm90_form == "gather" and not plan.compacts
    pool = torch.zeros(64 * 656 + 16, dtype=torch.uint8)
    q = torch.zeros(2, 32, 576, dtype=torch.bfloat16)
    idx = torch.zeros(2, 64, dtype=torch.int32)
    shifted = pool[8:8 + 64 * 656].view(64, 656)
    assert shifted.data_ptr() % 16 == 8
    with pytest.raises(ValueError, match=r"kv_cache: expected a pool whose first row is "
                                         r"16-byte aligned .* ≡ 8 \(mod 16\)"):
        plan.run(q, shifted, idx, check=False)
    assert not launches
    plan.run(q, pool[:64 * 656].view(64, 656), idx, check=False)
    assert launches and launches[0][1] == (2, plan.num_splits, 1)


def test_sparse_bad_shapes_and_devices_are_named(device):
    """q's head dim and an empty batch are named before any reshape; a pool on another device
    before any launch (the cache untouched)."""
    cache, live = sparse_pool("fp8_ds_mla", None, 4, 16, device, torch.Generator().manual_seed(0))
    idx = live[:8].to(torch.int32).repeat(2, 1).to(device)
    before = cache.pool.clone()
    with pytest.raises(ValueError, match=r"q: expected shape \[\*, \*, \*, 576\], got \[1, 2, 2, 512\]"):
        sparse_decode(torch.zeros(1, 2, 2, 512, dtype=torch.bfloat16, device=device),
                      cache.layer(0), idx.view(1, 2, 8), kv_format="fp8_ds_mla")
    with pytest.raises(ValueError, match=r"q: expected at least one query token, got shape \[0, 1"):
        sparse_decode(torch.zeros(0, 1, 2, 576, dtype=torch.bfloat16, device=device),
                      cache.layer(0), idx[:0].view(0, 1, 8), kv_format="fp8_ds_mla")
    with pytest.raises(ValueError, match=r"q: expected at least one query token, got shape \[0, 2"):
        sparse_prefill(torch.zeros(0, 2, 576, dtype=torch.bfloat16, device=device),
                       cache.layer(0), idx[:0], kv_format="fp8_ds_mla")
    with pytest.raises(ValueError, match=r"kv_cache: expected device .*, got meta"):
        sparse_prefill(torch.zeros(2, 2, 576, dtype=torch.bfloat16, device=device),
                       cache.layer(0).to("meta"), idx, kv_format="fp8_ds_mla")
    assert torch.equal(cache.pool, before)
