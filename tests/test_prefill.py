"""Dense prefill (`fp8mla.prefill`) against the float32 reference: any number of new tokens,
every format, poisoned pools, groups of tokens served in chunks."""

import zlib

import pytest
import torch

import fp8mla.decode as decode_mod
import fp8mla.prefill as prefill_mod
from fp8mla import ops, reference
from fp8mla.decode import DecodePlan
from fp8mla.prefill import (
    dense_prefill,
    dense_prefill_ragged,
    query_groups,
    ragged_group_size,
    ragged_groups,
    row_chunks,
    visible_slots,
)
from fp8mla.testing import assert_close
from helpers import paged_cache, ragged_prefill_reference

FORMATS = [("bf16", None), ("fp8", None), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")]

# (heads, S new tokens, lengths with them, page_size, block-table entries a chunk)
CASES = [
    (1, 7, [63], 16, 1 << 24),  # one chunk; the first group front-padded
    (3, 6, [70, 5, 0], 1, 100),  # chunks of one group; a request shorter than S, one empty
    (8, 9, [130, 9], 64, 9),  # chunks across the two requests' groups
    (16, 5, [65], 16, 10),
    (4, 5, [33, 20], 16, 9),  # padded groups, a chunk across two requests' groups
    (1, 3, [40, 2], 16, 1 << 24),  # S < GROUP: groups of S
    (2, 12, [12, 30], 64, 1 << 24),  # whole groups, no padding; a prompt over nothing cached
    (40, 6, [37, 90, 0], 64, 1 << 24),  # > 32 heads: SM90's 64-row Gluon kernels on a GPU
]


class _CountingPlan(DecodePlan):
    """A decode plan that records the requests of each run in ``runs``."""

    runs: list[int] = []

    def run(self, q, *args, **kw):
        self.runs.append(q.shape[0])
        return super().run(q, *args, **kw)


def _q(batch, s, heads, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, s, heads, 576, generator=g).bfloat16().to(device)


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("heads,s,lens,page_size,entries", CASES)
def test_prefill_matches_reference(device, monkeypatch, fmt, policy, heads, s, lens, page_size,
                                   entries):
    """Query i of a request's S new tokens sees its first length − S + 1 + i tokens (the
    reference's causal rule, which it applies to any s_q); those that see none: zeros, −inf.
    The pool's other pages are NaN-poisoned and block-table padding points past the pool."""
    monkeypatch.setattr(prefill_mod, "CHUNK_ENTRIES", entries)
    monkeypatch.setattr(prefill_mod, "DecodePlan", _CountingPlan)
    monkeypatch.setattr(_CountingPlan, "runs", chunks := [])
    seed = zlib.crc32(repr((fmt, policy, heads, s, lens, page_size)).encode())
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device=device,
                                        seed=seed)
    q = _q(len(lens), s, heads, device, seed + 1)
    out, lse = dense_prefill(q, cache.layer(0), table, seqlens, kv_format=cache.fmt,
                             softmax_scale=0.06, fp8_scale=cache.scale(0))
    group = min(s, prefill_mod.GROUP)
    groups = len(lens) * -(-s // group)
    step = max(1, entries // table.shape[1])  # groups a chunk (the row × heads bound is far)
    assert chunks == [step] * (groups // step) + [groups % step] * (groups % step > 0)
    assert out.shape == (len(lens), s, heads, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (len(lens), s, heads) and lse.dtype == torch.float32
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 0.06)
    blind = torch.tensor([[n - s + 1 + i <= 0 for i in range(s)] for n in lens],
                         device=lse.device)
    assert torch.all(out[blind] == 0) and torch.all(lse[blind] == float("-inf"))
    assert torch.all(lse[~blind].isfinite())
    assert_close(out, ro, name="out")
    assert_close(lse[~blind], rl[~blind], atol=3e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt,policy", FORMATS)
def test_prefill_on_packed_programs(device, monkeypatch, fmt, policy):
    """16 heads in groups of four (and a padded first group) with `SM90_PACKED` forced on:
    on an SM90 GPU every fp8 / fp8_ds_mla group runs as one 64-row Gluon program (asserted
    there), elsewhere as the switch leaves it; the result is the reference's either way."""
    from fp8mla.kernels import decode_sm90

    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)
    made = []
    monkeypatch.setattr(prefill_mod, "DecodePlan",
                        lambda **kw: made.append(DecodePlan(**kw)) or made[-1])
    lens, s = [70, 7, 3], 7
    cache, table, seqlens = paged_cache(fmt, lens, 64, policy=policy, device=device, seed=11)
    q = _q(len(lens), s, 16, device, 12)
    out, lse = dense_prefill(q, cache.layer(0), table, seqlens, kv_format=cache.fmt,
                             fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    blind = torch.tensor([[n - s + 1 + i <= 0 for i in range(s)] for n in lens],
                         device=lse.device)
    assert torch.all(out[blind] == 0) and torch.all(lse[blind] == float("-inf"))
    assert_close(out, ro, name="out")
    assert_close(lse[~blind], rl[~blind], atol=3e-3, rtol=1e-3, name="lse")
    sm90 = (device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
            and decode_sm90.AVAILABLE and fmt != "bf16")
    assert made and all(p.packed == sm90 for p in made)


def test_row_chunks_cover_the_rows_within_the_budget():
    assert row_chunks(10, 3, entries=9) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert row_chunks(1000, 1, heads=128) == [(0, 512), (512, 1000)]  # the plan's output bound
    assert row_chunks(5, 1000, entries=10) == [(r, r + 1) for r in range(5)]  # ≥ 1 row
    assert row_chunks(4, 0) == [(0, 4)] and row_chunks(0, 8) == []


def test_visible_slots_are_the_first_tokens_in_position_order():
    """The index lists of the layer's cast baselines and reference path."""
    table = torch.tensor([[5, 2, -7], [0, 9, 1]], dtype=torch.int32)
    idx = visible_slots(table, torch.tensor([0, 1, 1]), torch.tensor([3, 0, 5]), width=6,
                        page_size=2)
    assert idx.dtype == torch.int32
    assert idx.tolist() == [[10, 11, 4, -1, -1, -1], [-1] * 6, [0, 1, 18, 19, 2, -1]]


def test_prefill_any_q_layout_and_nothing_to_see(device):
    """q in [S, B] order (its batch and token dims do not merge: rows gathered a chunk at a
    time) gives what a contiguous q gives; lengths all 0 give zeros and lse −inf."""
    cache, table, seqlens = paged_cache("fp8_ds_mla", [20, 7], 16, device=device)
    q = _q(2, 8, 3, device, 5)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    args = (cache.layer(0), table)
    o1, l1 = dense_prefill(q, *args, seqlens, kv_format="fp8_ds_mla")
    o2, l2 = dense_prefill(qt, *args, seqlens, kv_format="fp8_ds_mla")
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    out, lse = dense_prefill(q, *args, torch.zeros_like(seqlens), kv_format="fp8_ds_mla")
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_query_groups_end_where_their_last_token_sees():
    """Group k of S new tokens (front-padded to whole groups) is as long as its last token
    sees: length − S + 1 + (its last token), 0 below."""
    lens = query_groups(torch.tensor([20, 3, 0], dtype=torch.int32), s=7, group=4)
    assert lens.dtype == torch.int32
    # S = 7: one padding row, then tokens 0-2 (the first group ends at token 2), tokens 3-6
    assert lens.tolist() == [16, 20, 0, 3, 0, 0]
    assert query_groups(torch.tensor([9], dtype=torch.int32), 2, 2).tolist() == [9]
    with pytest.raises(ValueError, match=r"group: expected an int in \[1, "):
        query_groups(torch.tensor([9], dtype=torch.int32), 2, 0)
    with pytest.raises(TypeError, match="cache_seqlens: expected dtype int32, got int64"):
        query_groups(torch.tensor([9]), 2, 2)


# (heads, each request's new tokens, lengths with them, page_size, block-table entries a chunk)
RAGGED_CASES = [
    (3, [6, 5, 0, 9], [70, 5, 0, 33], 16, 1 << 24),  # groups of 4: padded, one request empty
    (8, [1, 7, 2], [130, 7, 1], 64, 9),  # groups of 4 across chunks; a token that sees nothing
    (2, [2, 1, 3, 1], [40, 1, 2, 64], 1, 40),  # groups of 2 (7 tokens, 4 requests)
    (16, [5], [65], 64, 1 << 24),  # one request: `dense_prefill`'s groups
    (40, [3, 6], [37, 90], 64, 1 << 24),  # > 32 heads: SM90's 64-row Gluon kernels on a GPU
    (5, [1, 0, 1, 1], [20, 3, 1, 64], 16, 1 << 24),  # groups of 1 (3 tokens, 4 requests)
]


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("heads,news,lens,page_size,entries", RAGGED_CASES)
def test_ragged_prefill_matches_reference(device, monkeypatch, fmt, policy, heads, news, lens,
                                          page_size, entries):
    """Token i of request b's s_b new tokens sees its first length − s_b + 1 + i tokens, as
    the reference computes it request by request; poisoned pages and block-table padding as
    `test_prefill_matches_reference`'s; out and lse of exactly the tokens' rows."""
    monkeypatch.setattr(prefill_mod, "CHUNK_ENTRIES", entries)
    seed = zlib.crc32(repr(("ragged", fmt, policy, heads, news, page_size)).encode())
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device=device,
                                        seed=seed)
    t = sum(news)
    q = _q(1, t, heads, device, seed + 1)[0]
    cu = torch.tensor([0] + news, dtype=torch.int32).cumsum(0).int().to(device)
    out, lse = dense_prefill_ragged(q, cu, cache.layer(0), table, seqlens, kv_format=cache.fmt,
                                    softmax_scale=0.06, fp8_scale=cache.scale(0))
    assert out.shape == (t, heads, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (t, heads) and lse.dtype == torch.float32
    ro, rl = ragged_prefill_reference(q, news, cache, table, seqlens, 0.06)
    blind = torch.tensor([n - s + 1 + i <= 0 for n, s in zip(lens, news, strict=True)
                          for i in range(s)], device=lse.device)
    assert torch.all(out[blind] == 0) and torch.all(lse[blind] == float("-inf"))
    assert torch.all(lse[~blind].isfinite())
    assert_close(out, ro, name="out")
    assert_close(lse[~blind], rl[~blind], atol=3e-3, rtol=1e-3, name="lse")


def test_ragged_prefill_of_equal_requests_is_dense_prefill(device):
    """Requests of equal new tokens packed give what `dense_prefill` gives over q [B, S]."""
    cache, table, seqlens = paged_cache("fp8", [29, 11], 16, device=device, seed=3)
    q = _q(2, 6, 4, device, 4)
    cu = torch.tensor([0, 6, 12], dtype=torch.int32, device=device)
    args = (cache.layer(0), table, seqlens)
    o1, l1 = dense_prefill(q, *args, kv_format="fp8", fp8_scale=cache.scale(0))
    o2, l2 = dense_prefill_ragged(q.flatten(0, 1), cu, *args, kv_format="fp8",
                                  fp8_scale=cache.scale(0))
    assert torch.equal(o1.flatten(0, 1), o2) and torch.equal(l1.flatten(0, 1), l2)


def test_ragged_groups_cut_each_request_from_its_end():
    """Request b's s_b tokens make ceil(s_b / group) groups, the first front-padded, each as
    long as its last token sees; empty groups (length 0, rows all the spare) fill the bound
    (tokens + (group − 1) · batch) // group."""
    cu = torch.tensor([0, 5, 5, 7], dtype=torch.int32)  # s = 5, 0, 2
    owner, lens, rows = ragged_groups(cu, torch.tensor([9, 4, 1], dtype=torch.int32), 7, 4)
    assert owner.dtype == torch.int64 and lens.dtype == torch.int32 and rows.dtype == torch.int64
    # request 0: padding × 3 then token 0 (sees 9 − 4 = 5), tokens 1-4 (sees 9); request 2:
    # padding × 2, tokens 5, 6 (its second sees 1; the first sees 0); bound (7 + 9) // 4 = 4
    assert owner.tolist() == [0, 0, 2, 2]
    assert lens.tolist() == [5, 9, 1, 0]
    assert rows.tolist() == [[7, 7, 7, 0], [1, 2, 3, 4], [7, 7, 5, 6], [7, 7, 7, 7]]
    owner, lens, rows = ragged_groups(cu[:1], torch.zeros(0, dtype=torch.int32), 0, 4)
    assert owner.shape == lens.shape == (0,) and rows.shape == (0, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: expected shape \[4\], got \[3\]"):
        ragged_groups(cu[:3], torch.tensor([9, 4, 1], dtype=torch.int32), 7, 4)


def test_ragged_group_size_is_the_mean_request_up_to_a_group():
    assert [ragged_group_size(t, 4) for t in (1, 4, 5, 8, 9, 16, 100)] == [1, 1, 2, 2, 3, 4, 4]
    with pytest.raises(ValueError, match=r"batch: expected an int in \[1, inf\], got 0"):
        ragged_group_size(3, 0)
    with pytest.raises(ValueError, match=r"tokens: expected an int in \[1, inf\], got 0"):
        ragged_group_size(0, 2)


def test_ragged_groups_stay_inside_q_for_any_offsets():
    """Unchecked offsets (decreasing, past the tokens, negative) give rows in [0, tokens] —
    what the fast path gathers and scatters — and lengths ≥ 0."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        b = int(torch.randint(1, 6, (1,), generator=g))
        cu = torch.randint(-20, 40, (b + 1,), generator=g, dtype=torch.int32)
        lens = torch.randint(0, 50, (b,), generator=g, dtype=torch.int32)
        tokens = int(torch.randint(0, 30, (1,), generator=g))
        for group in (1, 3, 4):
            owner, glens, rows = ragged_groups(cu, lens, tokens, group)
            assert rows.numel() == 0 or (rows.min() >= 0 and rows.max() <= tokens)
            assert owner.numel() == 0 or (owner.min() >= 0 and owner.max() < b)
            assert torch.all(glens >= 0)


def test_ragged_prefill_rejects_bad_input(device):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [20, 7], 16, device=device)
    q = _q(1, 5, 4, device, 0)[0]
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)

    def call(**kw):
        args = dict(q=q, cu_seqlens_q=cu, kv_cache=cache.layer(0), block_table=table,
                    cache_seqlens=seqlens, kv_format="fp8_ds_mla")
        args.update(kw)
        pos = [args.pop(k) for k in ("q", "cu_seqlens_q", "kv_cache", "block_table",
                                     "cache_seqlens")]
        return dense_prefill_ragged(*pos, **args)

    with pytest.raises(ValueError, match=r"q: expected 3 dimensions, got shape \[1, 5, 4, 576\]"):
        call(q=q[None])
    with pytest.raises(TypeError, match="q: expected dtype bfloat16, got float32"):
        call(q=q.float())
    with pytest.raises(ValueError, match=r"heads \(q.shape\[1\]\): expected an int in \[1, 128\]"):
        call(q=_q(1, 5, 129, device, 0)[0])
    with pytest.raises(TypeError, match="cu_seqlens_q: expected dtype int32, got int64"):
        call(cu_seqlens_q=cu.long())
    with pytest.raises(ValueError, match=r"cu_seqlens_q: expected shape \[3\], got \[2\]"):
        call(cu_seqlens_q=cu[:2])
    for bad, value, entry in (([0, 3, 4], 4, 2), ([1, 3, 5], 1, 0), ([0, 4, 3], 3, 2),
                              ([0, 6, 5], 5, 2)):
        with pytest.raises(ValueError, match=f"cu_seqlens_q: expected offsets from 0, "
                                             f"non-decreasing, to 5 \\(q's tokens\\), got "
                                             f"{value} at entry {entry}"):
            call(cu_seqlens_q=torch.tensor(bad, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="cache_seqlens: expected lengths in \\[0, 48\\]"):
        call(cache_seqlens=torch.tensor([20, 49], dtype=torch.int32, device=device))
    # unchecked offsets past q: the rows stay inside q and the outputs (no index error)
    out, lse = call(cu_seqlens_q=torch.tensor([0, 9, 2], dtype=torch.int32, device=device),
                    check=False)
    assert out.shape == (5, 4, 512) and lse.shape == (5, 4)


def test_prefill_is_the_ops_role_and_the_doctor_takes_it():
    from fp8mla.backends import Role, Runtime, resolve
    from fp8mla.gpus import resolve_gpu

    assert ops.dense_prefill is dense_prefill and ops.dense_prefill_ragged is dense_prefill_ragged
    plan = resolve("deepseek_v3", Runtime(gpu=resolve_gpu("h200"), tp_size=8))
    choice = plan.choice(Role.DENSE_PREFILL)
    assert choice.backend == "fp8mla" and not choice.candidates[0].cuda_graph_safe
    assert "dense_prefill: fp8mla is not CUDA-graph safe" in plan.warnings


def test_prefill_rejects_bad_input(device):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [20, 7], 16, device=device)
    q = _q(2, 3, 4, device, 0)
    rows = cache.layer(0)
    before = cache.pool.clone()

    def call(**kw):
        args = dict(q=q, kv_cache=rows, block_table=table, cache_seqlens=seqlens,
                    kv_format="fp8_ds_mla")
        args.update(kw)
        return dense_prefill(args.pop("q"), args.pop("kv_cache"), args.pop("block_table"),
                             args.pop("cache_seqlens"), **args)

    with pytest.raises(TypeError, match="q: expected dtype bfloat16, got float32"):
        call(q=q.float())
    with pytest.raises(ValueError, match="q: expected head dim 576"):
        call(q=q[..., :512].contiguous())
    with pytest.raises(ValueError, match=r"heads \(q.shape\[2\]\): expected an int in \[1, 128\]"):
        call(q=_q(2, 1, 129, device, 0))
    with pytest.raises(ValueError, match="kv_cache: expected uint8 \\[num_pages, page_size, 576\\]"):
        call(kv_format="fp8")
    with pytest.raises(ValueError, match="cache_seqlens: expected lengths in \\[0, 48\\]"):
        call(cache_seqlens=torch.tensor([20, 49], dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="cache_seqlens: expected dtype int32, got int64"):
        call(cache_seqlens=seqlens.long())
    with pytest.raises(ValueError, match="block_table: expected 2 rows"):
        call(block_table=table[:1])
    bad = table.clone()
    bad[0, 0] = 10_000
    with pytest.raises(ValueError, match="block_table: a page within cache_seqlens points "
                                         "outside the pool"):
        call(block_table=bad)
    assert torch.equal(cache.pool, before)


def test_prefill_chunks_share_their_plans(device, monkeypatch):
    """Chunks of equal size share one decode plan (its buffers are allocated once); only a
    shorter last chunk gets a second."""
    made = []
    monkeypatch.setattr(prefill_mod, "DecodePlan",
                        lambda **kw: made.append((kw["batch"], kw["s_q"])) or DecodePlan(**kw))
    cache, table, seqlens = paged_cache("fp8", [40], 16, device=device)
    monkeypatch.setattr(prefill_mod, "CHUNK_ENTRIES", 2 * table.shape[1])  # two groups a chunk
    dense_prefill(_q(1, 19, 2, device, 0), cache.layer(0), table, seqlens, kv_format="fp8",
                  fp8_scale=cache.scale(0))
    assert made == [(2, 4), (1, 4)]  # 19 tokens, five groups: two chunks of two, then one
