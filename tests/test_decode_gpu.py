"""Dense decode at full size and under CUDA-graph capture (GPU only)."""

import functools

import pytest
import torch

import fp8mla.decode as decode_mod
from fp8mla import reference
from fp8mla.decode import DecodePlan
from fp8mla.testing import assert_close
from helpers import (
    assert_blind_rows,
    assert_close_qk8,
    assert_timeline_in_order,
    extreme_q,
    paged_cache,
    request_rows,
    sm90_gluon_only,
)

pytestmark = pytest.mark.gpu

FORMATS = [("bf16", None), ("fp8", None), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")]


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("heads,s_q,lens,page_size", [
    (8, 1, [8192, 1, 4097, 0], 64),
    (16, 2, [3000, 8191], 16),
    (128, 1, [2048, 65], 64),
    (64, 4, [1000, 1], 1),
    (3, 3, [20000], 256),
])
def test_full_size_matches_reference(fmt, policy, heads, s_q, lens, page_size):
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device="cuda",
                                        seed=len(lens) * heads)
    g = torch.Generator().manual_seed(heads)
    q = torch.randn(len(lens), s_q, heads, 576, generator=g).bfloat16().cuda()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=page_size, cache_seqlens=seqlens, device="cuda")
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_register_cap_matches_reference_and_schedules_more_programs(fmt):
    """DecodeConfig.maxnreg reaches the compiler: a 16-row program of 32-token tiles capped at
    168 registers (uncapped: 188–190) fits three to an SM on SM90 where its shared memory
    allows (triton 3.6 / 3.9; 3.8 stages more and holds two), the scheduler counts what the
    compile allows, and the result still matches the reference."""
    from dataclasses import replace

    from fp8mla.runtime import decode_config, resident_programs

    cache, table, seqlens = paged_cache(fmt, [5000, 63, 0], 64, device="cuda", seed=9)
    q = torch.randn(3, 1, 16, 576, generator=torch.Generator().manual_seed(9)).bfloat16().cuda()
    cfg = replace(decode_config(90, fmt, 16, 1), block_n=32, maxnreg=168)
    plan = DecodePlan(batch=3, num_heads=16, kv_format=fmt, page_size=64, cache_seqlens=seqlens,
                      device="cuda", config=cfg)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
    regs, shared = plan.compiled_resources
    assert regs <= 168
    assert plan.programs_per_sm == resident_programs(plan.target.cc, cfg.num_warps, regs, shared)
    if torch.cuda.get_device_capability() == (9, 0) and 3 * (shared + 1024) <= 228 * 1024:
        assert plan.programs_per_sm == 3


@pytest.mark.parametrize("heads,lens,page_size,splits", [
    (128, [8192, 1, 4097, 0], 64, None),
    (65, [1000, 63, 64, 65], 128, None),
    (100, [300, 5000, 129], 256, 3),
    (64, [130, 2], 64, 1),
    (128, [0, 70, 64], 64, 1),  # one split: the kernel writes lse_empty itself
    (33, [65, 1, 200], 64, None),  # the fewest heads that take it: 31 empty rows per program
    (128, [8192, 1, 4097, 0], 16, None),  # pages shorter than a tile: the gather kernel
    (65, [1000, 63, 64, 65], 1, None),
    (100, [300, 5000, 129], 32, 3),
    (128, [0, 70, 64], 16, 1),
])
def test_sm90_gluon_kernel_matches_reference(heads, lens, page_size, splits):
    """fp8 plans of 64-head programs take a Gluon kernel on SM90 — pages of ≥ 64 tokens the
    TMA kernel, shorter ones the gather kernel (`SM90_GATHER_FP8`): odd head counts (a
    part-empty second block), lengths around a tile, an empty request, pages of 1–256, forced
    split counts; every row a page holds past its request's end is e4m3 NaN (0x7F), so a
    partial tile that read them would poison the output. out / lse written into NaN-filled
    strided views (FlashMLA's [b, h, s_q] lse) with +inf for the empty request."""
    sm90_gluon_only("decode")
    plan = _check_poisoned_tails(heads, 1, lens, page_size, splits)
    assert plan.kernel == "sm90"
    assert plan._sm90_form() == ("tma" if page_size >= 64 else "gather")


def _check_max_logits(plan, q, kv, table, lens, page_size):
    """plan.max_logits [batch, s_q, heads] after a causal run: per query row the max of its
    scaled scores over the positions it sees (query i of s_q: the first len − s_q + i + 1),
    −inf where it sees none. kv: float32 [pages, page_size, 576], the pool dequantized."""
    assert plan.causal
    s_q = q.shape[1]
    for b, n in enumerate(lens):
        for i in range(s_q):
            seen = n - s_q + i + 1
            got = plan.max_logits[b, i]
            if seen <= 0:
                assert torch.all(got == float("-inf")), f"max_logits[{b}, {i}]: {got}"
                continue
            k = request_rows(kv, table, b, seen, page_size)
            ref = (q[b, i].float() @ k.T).max(-1)[0] * 576 ** -0.5
            assert_close(got, ref, atol=1e-3, rtol=1e-3, name=f"max_logits[{b}, {i}]")


def _check_poisoned_tails(heads, s_q, lens, page_size, splits, fmt="fp8", policy=None,
                          max_seqlen=None):
    """An fp8, fp8_ds_mla or bf16 plan's run against the reference with the rows a page holds
    past its request's end NaN (every byte 0x7F, e4m3 NaN, in the latent — 0xFF in bf16 rows;
    fp8_ds_mla's scales and rope NaN too), so a partial tile that read them would poison the
    output; out / lse written into NaN-filled strided views (FlashMLA's [b, h, s_q] lse) with
    empty_lse +inf for every row that sees nothing; max_logits (the kernel's or the combine's)
    checked for every query row: the max scaled score over what the row sees, −inf where it
    sees nothing. The plan is made for the lengths, or (``max_seqlen``) for that bound alone.
    Returns the plan."""
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device="cuda",
                                        seed=21 + s_q)
    rows = cache.layer(0).view(-1, cache.fmt.row_bytes)
    for b, n in enumerate(lens):  # the page tail past each length: NaN bytes
        end = -(-n // page_size) * page_size
        pos = torch.arange(n, end, device="cuda")
        tail = table[b, pos // page_size].long() * page_size + pos % page_size
        rows[tail] = 0xFF if cache.fmt.name == "bf16" else 0x7F  # NaN: bf16 0xFFFF, e4m3 0x7F
        if cache.fmt.name == "fp8_ds_mla":  # scales and rope NaN too, not just large
            rows[tail, 512:528] = torch.full((len(tail), 4), float("nan"),
                                             device="cuda").view(torch.uint8)
            rows[tail, 528:] = torch.full((len(tail), 64), float("nan"), device="cuda",
                                          dtype=torch.bfloat16).view(torch.uint8)
    q = torch.randn(len(lens), s_q, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=page_size, device="cuda", num_splits=splits,
                      **({"cache_seqlens": seqlens} if max_seqlen is None
                         else {"max_seqlen": max_seqlen}))
    out = torch.full((len(lens), s_q, heads, 512), float("nan"), device="cuda").bfloat16()
    lse = torch.full((len(lens), heads, s_q), float("nan"), device="cuda")
    plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0), out=out,
             lse=lse.transpose(1, 2), empty_lse=float("inf"))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    # empty_lse for every row that sees nothing: empty requests, and causally the first
    # queries of a request shorter than s_q
    rl = torch.where(rl == float("-inf"), float("inf"), rl)
    assert_close(lse.transpose(1, 2), rl, atol=1e-3, rtol=1e-3, name="lse")
    assert torch.all(lse.transpose(1, 2)[[b for b, n in enumerate(lens) if not n]]
                     == float("inf"))
    _check_max_logits(plan, q, cache.dequantize(0), table, lens, page_size)
    return plan


def _mma8_only(monkeypatch, stages=None):
    """Switch the ≤ 8-row Gluon kernels on (`SM90_MMA8`, `SM90_MMA8_DS` with ``stages`` ring
    stages or its default); skip where they cannot serve."""
    sm90_gluon_only("decode")
    monkeypatch.setattr(decode_mod, "SM90_MMA8", True)
    monkeypatch.setattr(decode_mod, "SM90_MMA8_DS", True)
    if stages:
        monkeypatch.setattr(decode_mod, "SM90_MMA8_DS_STAGES", stages)



@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", [
    (8, 1, [8192, 1, 4097, 0, 130], 64, None),
    (8, 1, [131072], 64, None),  # GLM-5 at TP8, one long request: 256 splits
    (8, 1, [70000, 5], 128, 1),  # one split, many tiles through the ring
    (4, 2, [3000, 63, 64], 64, None),  # causal among s_q queries
    (2, 4, [1000, 65, 0], 256, 3),
    (7, 1, [0, 70, 64], 64, 1),  # one split: the kernel writes lse_empty itself
    (1, 1, [65, 1, 200], 64, None),
    (3, 2, [129, 20000], 64, 2),
])
@pytest.mark.parametrize("fmt,policy,stages", [("fp8", None, None), ("fp8_ds_mla", "pow2", 2),
                                               ("fp8_ds_mla", "fp32", 3)])
def test_sm90_mma8_kernel_matches_reference(heads, s_q, lens, page_size, splits, fmt, policy,
                                            stages, monkeypatch):
    """fp8 and fp8_ds_mla plans of s_q × heads ≤ 8 on the Gluon mma.sync kernels (switched
    on; fp8_ds_mla at 2 and 3 ring stages, both scale policies): odd head counts, causal
    s_q > 1, lengths around a tile, empty requests, pages of 64–256, forced split counts, NaN
    page tails."""
    _mma8_only(monkeypatch, stages)
    plan = _check_poisoned_tails(heads, s_q, lens, page_size, splits, fmt, policy)
    assert plan.mma8 and plan.sm90 and plan.kernel == "mma8"


@pytest.mark.parametrize("heads", [8, 16, 32])
def test_sm90_mma8_timeline_stamps_in_order(heads, monkeypatch):
    """`DecodePlan.timeline` (the debug stamps `benchmarks/timeline.py` reads): every program
    of the fp8 ≤ 16-row kernel (none empty here; 32 heads: two head blocks, each program its
    own row) stamps entry ≤ loop start ≤ tile 0 landed ≤ loop end ≤ exit on the global timer,
    within a second of each other, and an SM id; the outputs still match."""
    _mma8_only(monkeypatch)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_MIN_TILES", 0)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", True)
    cache, table, seqlens = paged_cache("fp8", [5000, 700, 1000], 64, device="cuda", seed=5)
    q = torch.randn(3, 1, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=3, num_heads=heads, s_q=1, kv_format=cache.fmt, page_size=64,
                      cache_seqlens=seqlens, device="cuda", num_splits=4)
    assert plan.kernel == ("mma8" if heads == 8 else "mma16")
    assert plan.head_blocks == (2 if heads == 32 else 1)
    plan.timeline = torch.full((plan.head_blocks * 3 * 4, 12), -1, dtype=torch.int64,
                               device="cuda")
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
    assert_timeline_in_order(plan.timeline)


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_sm90_mma8_kernel_in_a_graph_and_second_pool(fmt, monkeypatch):
    """The ≤ 8-row kernels captured once and replayed with new lengths and contents; one plan
    over two pools in turn (descriptors are built per pool)."""
    _mma8_only(monkeypatch)
    assert _graph_replays(fmt, heads=8).mma8
    assert _second_pool(heads=8, fmt=fmt).mma8


def _mma16_only(monkeypatch, stages=None, qk8=False):
    """Switch the ≤ 16-row kernels' wide forms on (`SM90_MMA16`, `SM90_MMA16_DS`; with
    ``stages`` ring stages or their defaults) for programs of any length, their first product
    on mma.sync or (``qk8``) FP8 wgmma (`SM90_MMA16_QK8`, `SM90_MMA8_DS_QK8`); skip where they
    cannot serve."""
    _mma8_only(monkeypatch)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_QK8", qk8)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_QK8_MIN_TILES", 0)
    monkeypatch.setattr(decode_mod, "SM90_MMA8_DS_QK8", qk8)
    monkeypatch.setattr(decode_mod, "SM90_MMA16", True)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_DS", True)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_MIN_TILES", 0)  # short programs too
    monkeypatch.setattr(decode_mod, "SM90_MMA16_DS_MIN_TILES", 0)
    if stages:
        monkeypatch.setattr(decode_mod, "SM90_MMA16_STAGES", stages)
        monkeypatch.setattr(decode_mod, "SM90_MMA8_DS_STAGES", stages)


@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", [
    (16, 1, [8192, 1, 4097, 0, 130], 64, None),
    (16, 1, [131072], 64, None),  # one long request: every split
    (16, 1, [70000, 5], 128, 1),  # one split, many tiles through the ring
    (8, 2, [3000, 63, 64], 64, None),  # causal among s_q queries
    (4, 4, [1000, 65, 0], 256, 3),
    (13, 1, [0, 70, 64], 64, 1),  # one split: the kernel writes lse_empty itself
    (9, 1, [65, 1, 200], 64, None),
    (5, 3, [129, 20000], 64, 2),
])
@pytest.mark.parametrize("fmt,policy,stages", [("fp8", None, 2), ("fp8", None, 3),
                                               ("fp8_ds_mla", "pow2", 2),
                                               ("fp8_ds_mla", "fp32", 3)])
def test_sm90_mma16_kernel_matches_reference(heads, s_q, lens, page_size, splits, fmt, policy,
                                             stages, monkeypatch):
    """Plans of 9–16 query rows on the wide forms (qᵀ read from shared memory every tile;
    switched on, 2 and 3 ring stages; fp8_ds_mla with both scale policies): odd row counts,
    causal s_q > 1, lengths around a tile, empty requests, pages of 64–256, forced split
    counts, NaN page tails (fp8_ds_mla: scales and rope too)."""
    _mma16_only(monkeypatch, stages)
    plan = _check_poisoned_tails(heads, s_q, lens, page_size, splits, fmt, policy)
    assert plan.mma8 and plan.kernel == "mma16" and plan.ring_stages == stages


@pytest.mark.parametrize("max_seqlen", [100, 3000, 20001])
@pytest.mark.parametrize("fmt,heads", [("fp8", 8), ("fp8", 16), ("fp8_ds_mla", 8),
                                       ("fp8_ds_mla", 16)])
def test_sm90_mma_kernels_any_length_hint(fmt, heads, max_seqlen, monkeypatch):
    """The ≤ 16-row kernels look up tile 0's page for a request of the plan's longest length
    while the request's own loads (`decode_sm90_mma8._ring_start`): plans made for a bound far
    below the lengths they run, at a middle one and at the longest (each request's first split
    guessed right; the later ones only where the request's length gives the bound's chunk)
    match the reference, NaN page tails unread."""
    _mma16_only(monkeypatch)
    policy = "pow2" if fmt == "fp8_ds_mla" else None
    plan = _check_poisoned_tails(heads, 1, [20001, 3000, 65, 0, 700], 64, 4, fmt, policy,
                                 max_seqlen=max_seqlen)
    assert plan.kernel == ("mma8" if heads == 8 else "mma16") and plan._len_hint == max_seqlen


@pytest.mark.parametrize("fmt,policy,heads", [("fp8", None, 8), ("fp8", None, 16),
                                              ("fp8_ds_mla", "pow2", 8),
                                              ("fp8_ds_mla", "fp32", 16)])
def test_sm90_mma_kernels_max_growing_tile_after_tile(fmt, policy, heads, monkeypatch):
    """Scores whose running max keeps growing, each time in another warp's 16 tokens: keys
    scaled up along the sequence, and in tile k the key at 16 · (k % 4) + 5 aligned with head
    0's q (larger each tile, as far as e4m3 resolves it). The ≤ 16-row kernels' rescaling of
    the accumulators (skipped on tiles where no row's max grew) matches the reference,
    max_logits included."""
    _mma16_only(monkeypatch)
    lens = [5000, 700]
    g = torch.Generator().manual_seed(heads)
    q = torch.randn(2, 1, heads, 576, generator=g).bfloat16().cuda()

    def rows(b, lat, rope):
        n, dev = lat.shape[0], lat.device
        ramp = 0.3 + 2.0 * torch.arange(n, device=dev) / n
        lat, rope = lat * ramp[:, None], rope * ramp[:, None]
        tiles = torch.arange(0, n - 21, 64, device=dev)
        spikes = tiles + 16 * (tiles // 64 % 4) + 5
        lat[spikes] = q[b, 0, 0, :512].float().sign().to(dev) * ramp[spikes, None]
        return lat, rope

    cache, table, seqlens = paged_cache(fmt, lens, 64, policy=policy, device="cuda", seed=5,
                                        rows=rows)
    plan = DecodePlan(batch=2, num_heads=heads, kv_format=cache.fmt, page_size=64,
                      cache_seqlens=seqlens, device="cuda", num_splits=2)
    assert plan.kernel == ("mma8" if heads == 8 else "mma16")
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    kv = cache.dequantize(0)
    ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
    assert rl[:, 0, 0].min() > 20  # head 0's spikes dominate: its max grew tile after tile
    _check_max_logits(plan, q, kv, table, lens, 64)


@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", [
    (16, 1, [8192, 1, 4097, 0, 130], 64, None),
    (16, 1, [131072], 64, None),
    (8, 2, [3000, 63, 64], 64, None),  # causal among s_q queries
    (4, 4, [1000, 65, 0], 256, 3),
    (13, 1, [0, 70, 64], 64, 1),  # one split: the kernel writes lse_empty itself
    (9, 1, [65, 1, 200], 64, None),
])
def test_sm90_mma16_fp8_scores_match_reference(heads, s_q, lens, page_size, splits,
                                               monkeypatch):
    """The fp8 wide form with its first product as FP8 wgmma (`SM90_MMA16_QK8`: the ring's
    e4m3 bytes against q's e4m3 halves) on the wide form's cases: odd row counts, causal s_q >
    1, lengths around a tile, empty requests, pages of 64–256, forced split counts, NaN page
    tails."""
    _mma16_only(monkeypatch, qk8=True)
    plan = _check_poisoned_tails(heads, s_q, lens, page_size, splits, "fp8", None)
    assert plan.kernel == "mma16" and plan.qk8


@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", [
    (8, 1, [8192, 1, 4097, 0, 130], 64, None),
    (4, 2, [3000, 63, 64], 64, None),
    (7, 1, [0, 70, 64], 64, 1),
    (16, 1, [8192, 1, 4097, 0, 130], 64, None),
    (8, 2, [3000, 63, 64], 128, None),
    (13, 1, [0, 70, 64], 64, 1),
])
@pytest.mark.parametrize("policy", ["pow2", "fp32"])
def test_sm90_mma_ds_fp8_scores_match_reference(heads, s_q, lens, page_size, splits, policy,
                                                monkeypatch):
    """fp8_ds_mla on the wide form with the first product as FP8 wgmma per 128-dim scale chunk
    (`SM90_MMA8_DS_QK8`; the 8-row form keeps mma.sync), both scale policies, NaN page tails
    (scales and rope too)."""
    _mma16_only(monkeypatch, qk8=True)
    plan = _check_poisoned_tails(heads, s_q, lens, page_size, splits, "fp8_ds_mla", policy)
    wide = s_q * heads > 8
    assert plan.kernel == ("mma16" if wide else "mma8") and plan.qk8 == wide


# plans of 17–32 query rows in head blocks (requests hold at least s_q tokens: below)
HEAD_BLOCK_CASES = [
    (16, 2, [8192, 2, 4097, 0, 130], None),  # MTP: 32 rows in two blocks of 8 heads
    (8, 4, [3000, 63, 64], 3),
    (32, 1, [0, 70, 2000], 1),  # one split: the kernel writes lse and max_logits itself
    (32, 1, [129, 20000], None),
]


@pytest.mark.parametrize("heads,s_q,lens,splits", HEAD_BLOCK_CASES)
@pytest.mark.parametrize("qk8", [False, True])
@pytest.mark.parametrize("policy", ["pow2", "fp32"])
def test_sm90_mma16_ds_head_blocks_match_reference(heads, s_q, lens, splits, policy, qk8,
                                                   monkeypatch):
    """fp8_ds_mla plans of 17–32 query rows on the wide form in head blocks of 16 // s_q heads
    (`SM90_MMA16_DS_HEAD_BLOCKS`): each block's rows, outputs, partials and max_logits
    addressed from its first head (max_logits through the combine too); both first products;
    causal s_q > 1, empty requests, NaN page tails. (Requests hold at least s_q tokens: a
    query row that sees nothing gets ``empty_lse``, which the reference does not model;
    session 24's first form of this case had a request of length 1 at s_q 2, and exactly its
    16 blind rows differed, +inf against −inf.)"""
    _mma16_only(monkeypatch, qk8=qk8)
    plan = _check_poisoned_tails(heads, s_q, lens, 64, splits, "fp8_ds_mla", policy)
    assert plan.kernel == "mma16" and plan.head_blocks == 2 and plan.qk8 == qk8


@pytest.mark.parametrize("heads,s_q,lens,splits", HEAD_BLOCK_CASES)
@pytest.mark.parametrize("qk8", [False, True])
def test_sm90_mma16_fp8_head_blocks_match_reference(heads, s_q, lens, splits, qk8,
                                                    monkeypatch):
    """fp8 plans of 17–32 query rows on the fp8 wide form in head blocks of 16 // s_q heads
    (`SM90_MMA16_FP8_HEAD_BLOCKS` forced on; by default on triton 3.8 and from 4 splits): each block's
    rows, outputs, partials and max_logits addressed from its first head; both first
    products; causal s_q > 1, empty requests, NaN page tails (requests hold ≥ s_q tokens, as
    in the fp8_ds_mla case above)."""
    _mma16_only(monkeypatch, qk8=qk8)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", True)
    plan = _check_poisoned_tails(heads, s_q, lens, 64, splits, "fp8")
    assert plan.kernel == "mma16" and plan.head_blocks == 2 and plan.qk8 == qk8


@pytest.mark.parametrize("fmt,policy", [("fp8", None), ("fp8_ds_mla", "pow2"),
                                        ("fp8_ds_mla", "fp32")])
def test_sm90_mma16_fp8_scores_any_q_magnitude(fmt, policy, monkeypatch):
    """q's e4m3 halves are scaled per row by a power of two: `extreme_q`'s rows match the
    reference on both formats' FP8 first products (the halves hold bf16 q exactly inside
    e4m3's range, so the 1e-4, 1e-30 and zero rows meet the standard tolerance; the wgmma's
    low-precision sums, promoted to float32 every 128 dims, err in proportion to the row's
    largest logit: `assert_close_qk8`)."""
    _mma16_only(monkeypatch)  # the switches off: the plan asks for it (``fp8_scores``)
    lens = [700, 3000]
    cache, table, seqlens = paged_cache(fmt, lens, 64, policy=policy, device="cuda", seed=8)
    q = extreme_q(2, 16, seed=8).unsqueeze(1)
    plan = DecodePlan(batch=2, num_heads=16, kv_format=cache.fmt, page_size=64,
                      cache_seqlens=seqlens, device="cuda", num_splits=2, fp8_scores=True)
    assert plan.kernel == "mma16" and plan.qk8
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    kv = cache.dequantize(0)
    ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
    logit_max = torch.stack([
        (q[b, 0].float() @ request_rows(kv, table, b, n, 64).T).abs().max(-1)[0]
        for b, n in enumerate(lens)])[:, None] * 576 ** -0.5
    assert_close_qk8(out, lse, ro, rl, logit_max)


@pytest.mark.parametrize("lens,splits", [([131072], 256), ([20001, 3000, 1], 64)])
def test_narrow_combine_programs(lens, splits):
    """The combine's one-warp programs under 128 dims (`fp8mla.decode.combine_warps`; 4 warps
    until session 33) match the reference with NaN page tails — B=1 × 128K's 256 splits in
    16-dim programs, three requests (one of a token: splits past it empty) in 32-dim ones."""
    plan = _check_poisoned_tails(8, 1, lens, 64, splits)
    block_d = decode_mod.combine_blocks(len(lens) * 8, plan.num_splits, plan.target.num_sms)[0]
    assert block_d < 128  # one-warp programs (H200: 16, 32 dims)


@pytest.mark.parametrize("fmt,heads,kernel", [("fp8", 8, "mma8"), ("fp8", 16, "mma16"),
                                              ("fp8_ds_mla", 8, "mma8"),
                                              ("fp8_ds_mla", 16, "mma16"), ("fp8", 128, "sm90"),
                                              ("bf16", 16, "triton"), ("fp8", 32, "triton"),
                                              ("fp8", 32, "mma16"),  # head blocks
                                              ("fp8_ds_mla", 32, "mma16")])  # head blocks
def test_bf16_partials_on_every_kernel(fmt, heads, kernel, monkeypatch):
    """Split partials in bfloat16 (`PARTIALS_BF16_MIN_SPLITS` 1, `PARTIALS_BF16_EVERYWHERE`:
    on the Triton kernel over FP8 rows too, whose default is float32) through the dense Gluon
    kernels' and the Triton kernel's partial stores (over bf16 and FP8 rows) and the combine:
    forced splits, NaN page tails (the sparse kernels': tests/test_sparse_gpu.py); the wide
    forms with their FP8 first product; fp8 at 32 heads on the Triton kernel or in head blocks
    (`SM90_MMA16_FP8_HEAD_BLOCKS`, whose rule takes head blocks at these 5 splits)."""
    _mma16_only(monkeypatch, qk8=True)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", kernel == "mma16")
    monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", 1)
    monkeypatch.setattr(decode_mod, "PARTIALS_BF16_EVERYWHERE", True)
    plan = _check_poisoned_tails(heads, 1, [8192, 1, 4097, 0, 130], 64, 5, fmt,
                                 "pow2" if fmt == "fp8_ds_mla" else None)
    assert plan.kernel == kernel and plan.part_out.dtype == torch.bfloat16
    assert plan.qk8 == (kernel == "mma16")


@pytest.mark.parametrize("heads,splits,in_order,bf16_partials", [
    (128, 1, True, False), (100, 5, True, True), (128, 5, True, True), (128, 5, True, False),
    (128, 1, False, False), (128, 5, False, False)])
def test_sm90_rows_in_order(heads, splits, in_order, bf16_partials, monkeypatch):
    """The 64-row Gluon kernel's bf16 rows stored 8 dims a thread in dim order
    (`SM90_ROWS_IN_ORDER`, `decode_sm90._store_o`) — out (one split) and its bf16 partials (the
    default in split plans) — float32 partials (stored in place either way), and the
    accumulator's stores (the switch off) match the reference with NaN page tails; 100 heads: a
    part-empty second head block."""
    sm90_gluon_only("decode")
    monkeypatch.setattr(decode_mod, "SM90_ROWS_IN_ORDER", in_order)
    if not bf16_partials:
        monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", 1025)
    plan = _check_poisoned_tails(heads, 1, [8192, 1, 4097, 0, 130], 64, splits)
    assert plan.kernel == "sm90"
    if splits > 1:
        assert plan.part_out.dtype == (torch.bfloat16 if bf16_partials else torch.float32)


@pytest.mark.parametrize("fmt,heads,s_q", [("fp8", 8, 1), ("fp8", 16, 1), ("fp8", 4, 2),
                                           ("fp8", 3, 1), ("fp8_ds_mla", 8, 1),
                                           ("fp8_ds_mla", 16, 1), ("fp8_ds_mla", 4, 2),
                                           ("fp8_ds_mla", 3, 1), ("fp8_ds_mla", 32, 1)])
@pytest.mark.parametrize("splits,min_splits", [(5, 1), (5, 1025), (1, 1)])
def test_sm90_row_stores(fmt, heads, s_q, splits, min_splits, monkeypatch):
    """The ≤ 16-row kernels' output or partial rows, stored 16 bytes a store
    (`decode_sm90_mma8._store_in_order`: the dense kernel's dims 4m + j and fp8_ds_mla's chunks
    128j + d(m) relabelled into order) — partials in bf16 and in float32, and one-split plans
    straight to out — match the reference with NaN page tails (rows of absent heads: 3 heads in
    an 8-row program; fp8_ds_mla's 32 heads in two 16-head blocks)."""
    _mma16_only(monkeypatch)
    monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", min_splits)
    plan = _check_poisoned_tails(heads, s_q, [8192, 1, 4097, 0, 130], 64, splits, fmt,
                                 "pow2" if fmt == "fp8_ds_mla" else None)
    assert plan.kernel == ("mma8" if heads * s_q <= 8 else "mma16")
    if splits > 1:
        assert plan.part_out.dtype == (torch.bfloat16 if min_splits == 1 else torch.float32)


@pytest.mark.parametrize("qk8", [False, True])
@pytest.mark.parametrize("fmt,heads", [("fp8", 4), ("fp8", 8), ("fp8_ds_mla", 4),
                                       ("fp8_ds_mla", 8)])
def test_sm90_mma_kernels_non_causal_mtp(fmt, heads, qk8, monkeypatch):
    """s_q 2, not causal, on the ≤ 16-row kernels (8 rows; 16: the wide forms, switched on,
    both first products): each query sees the whole context, as s_q = 1 — for fp8, the path
    where the kernel skips the mask on every tile but a request's last."""
    _mma16_only(monkeypatch, qk8=qk8)
    assert _non_causal_mtp(fmt, heads).kernel == ("mma8" if heads == 4 else "mma16")


def _non_causal_mtp(fmt, heads):
    """A non-causal s_q 2 plan's run against the reference, query by query (each sees the
    whole context); the plan."""
    lens = [3000, 65, 64, 1]
    cache, table, seqlens = paged_cache(fmt, lens, 64, device="cuda", seed=heads)
    q = torch.randn(len(lens), 2, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=2, kv_format=cache.fmt,
                      page_size=64, cache_seqlens=seqlens, device="cuda", causal=False)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    for i in range(2):
        ro, rl = reference.dense_mla_decode(q[:, i:i + 1], cache.dequantize(0), table, seqlens,
                                            576 ** -0.5)
        assert_close(out[:, i:i + 1], ro, name=f"query {i}")
        assert_close(lse[:, i:i + 1], rl, atol=1e-3, rtol=1e-3, name=f"lse {i}")
    return plan


@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", [
    (128, 2, [8192, 1, 4097, 0], 64, None),  # a request shorter than s_q: query 0 sees none
    (65, 3, [1000, 2, 64, 66], 64, None),
    (100, 4, [300, 5000, 129], 256, 3),
    (64, 2, [130, 3], 64, 1),  # one split: the kernel writes lse_empty itself
    (128, 2, [3000, 2, 65], 16, None),  # fp8: the gather kernel
])
@pytest.mark.parametrize("fmt,policy", [("fp8", None), ("fp8_ds_mla", "pow2"),
                                        ("fp8_ds_mla", "fp32")])
def test_sm90_gluon_kernels_mtp_match_reference(heads, s_q, lens, page_size, splits, fmt,
                                                policy):
    """s_q 2–4 (causal) on the 64-row Gluon kernels (`SM90_MTP`), one query's heads a program:
    each query row sees its own prefix (query i of s_q the first len − s_q + 1 + i tokens;
    none where that is ≤ 0), poisoned page tails, odd heads, forced splits; max_logits per
    query row."""
    sm90_gluon_only("decode")
    plan = _check_poisoned_tails(heads, s_q, lens, page_size, splits, fmt=fmt, policy=policy)
    assert plan.kernel == "sm90"


@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", [
    (16, 4, [8192, 1, 4097, 0, 3], 64, None),  # requests shorter than s_q: rows that see none
    (32, 2, [1000, 2, 64, 66], 64, None),
    (11, 3, [300, 5000, 129], 256, 3),  # 33 rows; forced splits
    (16, 4, [130, 3], 64, 1),  # one split: the kernel writes lse_empty itself
    (16, 4, [3000, 2, 65], 16, None),  # fp8: the gather kernel
    (20, 3, [777, 64, 5], 1, 5),  # pages of one token
])
@pytest.mark.parametrize("fmt,policy", [("fp8", None), ("fp8_ds_mla", "pow2"),
                                        ("fp8_ds_mla", "fp32")])
def test_sm90_gluon_kernels_packed_match_reference(heads, s_q, lens, page_size, splits, fmt,
                                                   policy, monkeypatch):
    """`SM90_PACKED` (forced on): every query's heads in one 64-row program, each row masked to
    its own query's prefix (query i of s_q sees len − s_q + 1 + i tokens; none where ≤ 0),
    through the checks of `test_sm90_gluon_kernels_mtp_match_reference` (poisoned page tails,
    NaN-filled strided outputs, max_logits per query row)."""
    sm90_gluon_only("decode")
    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)
    plan = _check_poisoned_tails(heads, s_q, lens, page_size, splits, fmt=fmt, policy=policy)
    assert plan.kernel == "sm90" and plan.packed and plan._query_blocks == 1


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_sm90_gluon_kernels_packed_non_causal_and_in_a_graph(fmt, monkeypatch):
    """Packed programs (`SM90_PACKED`, forced on), not causal: every query sees the whole
    context; and a packed plan captured once, replayed with new lengths and contents."""
    sm90_gluon_only("decode")
    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)
    assert _non_causal_mtp(fmt, 32).packed
    assert _graph_replays(fmt, heads=16, s_q=4).packed


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_sm90_gluon_kernels_non_causal_mtp(fmt):
    """s_q 2, not causal, on the 64-row Gluon kernels: each query sees the whole context."""
    sm90_gluon_only("decode")
    assert _non_causal_mtp(fmt, 128).kernel == "sm90"


@pytest.mark.parametrize("qk8", [False, True])
@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_sm90_mma16_kernel_in_a_graph_and_second_pool(fmt, qk8, monkeypatch):
    """The wide forms (both first products) captured once and replayed with new lengths and
    contents; one plan over two pools in turn."""
    _mma16_only(monkeypatch, qk8=qk8)
    assert _graph_replays(fmt, heads=16).kernel == "mma16"
    assert _second_pool(heads=16, fmt=fmt).kernel == "mma16"


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_sm90_gluon_kernel_in_a_graph(fmt):
    """The 64-row Gluon kernels (fp8 by TMA, fp8_ds_mla gathered through the block table; 128
    heads) captured once, replayed with new lengths and contents."""
    sm90_gluon_only("decode")
    assert _graph_replays(fmt, heads=128).kernel == "sm90"


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_sm90_gluon_kernel_second_pool(fmt):
    """One plan run over two pools in turn (the fp8 kernel's TMA descriptors are built per
    pool): each result matches its own pool's reference, also on returning to the first."""
    sm90_gluon_only("decode")
    assert _second_pool(heads=128, fmt=fmt).kernel == "sm90"


@pytest.mark.parametrize("heads,lens,page_size,splits,policy", [
    (128, [8192, 1, 4097, 0], 64, None, "pow2"),
    (65, [1000, 63, 64, 65], 1, None, "fp32"),  # one-token pages: every row its own page
    (100, [300, 5000, 129], 16, 3, "pow2"),
    (64, [130, 2], 256, 1, "fp32"),
    (128, [0, 70, 64], 64, 1, "pow2"),  # one split: the kernel writes lse_empty itself
    (33, [65, 1, 200], 32, None, "fp32"),  # the fewest heads that take it
])
def test_sm90_ds_paged_kernel_matches_reference(heads, lens, page_size, splits, policy):
    """Dense fp8_ds_mla plans of 64-head programs take the sparse Gluon kernel's PAGED form
    on SM90 (`SM90_DS_PAGED`): pages of 1–256 tokens, odd head counts, lengths around a tile,
    empty requests, forced split counts; every row a page holds past its request's end is NaN
    (latent, scales and rope), out / lse written into NaN-filled strided views."""
    sm90_gluon_only("decode")
    plan = _check_poisoned_tails(heads, 1, lens, page_size, splits, fmt="fp8_ds_mla",
                                 policy=policy)
    assert plan.kernel == "sm90"


def _second_pool(heads, fmt="fp8"):
    """One plan run over two pools in turn, each against its own reference; the plan."""
    lens = [1000, 129]
    pools = [paged_cache(fmt, lens, 64, device="cuda", seed=s) for s in (41, 42)]
    q = torch.randn(2, 1, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=2, num_heads=heads, kv_format=fmt, page_size=64, max_seqlen=1024,
                      device="cuda")
    for cache, table, seqlens in (*pools, pools[0]):
        out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
        ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
        assert_close(out, ro, name="out")
        assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")
    return plan


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla", "bf16"])
def test_cuda_graph_replays_with_new_lengths_and_contents(fmt):
    _graph_replays(fmt)


@pytest.mark.parametrize("heads,s_q,lens", [(8, 1, [8192, 1, 4097, 0, 130]), (5, 2, [3000, 63]),
                                           (3, 3, [20000, 64])])
def test_tma_tiles_match_reference_past_page_tails(heads, s_q, lens, monkeypatch):
    """fp8 TMA tiles in the Triton kernel (rope box read before the words are converted; the
    ≤ 16-row Gluon kernels off): the scores' positions follow their rows through causal
    s_q > 1, partial last tiles and split boundaries. Every page tail past a length is e4m3
    NaN: a position attached to the wrong row would attend to one."""
    monkeypatch.setattr(decode_mod, "SM90_MMA8", False)  # (the fp8 wide form with it)
    cache, table, seqlens = paged_cache("fp8", lens, 64, device="cuda", seed=heads)
    rows = cache.layer(0).view(-1, 576)
    for b, n in enumerate(lens):
        pos = torch.arange(n, -(-n // 64) * 64, device="cuda")
        rows[table[b, pos // 64].long() * 64 + pos % 64] = 0x7F
    q = torch.randn(len(lens), s_q, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format="fp8",
                      page_size=64, cache_seqlens=seqlens, device="cuda")
    assert plan.tma and plan.kernel == "triton"
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    full = [b for b, n in enumerate(lens) if n]
    assert_close(lse[full], rl[full], atol=1e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt,heads", [("fp8", 8), ("fp8", 16), ("fp8_ds_mla", 16), ("fp8", 128),
                                       ("bf16", 16)])
def test_programmatic_dependent_combine_in_a_graph(monkeypatch, fmt, heads):
    """fp8mla.decode.PDL (the split combine launched as a programmatic dependent of the decode
    kernel, SM90; on by default): behind each kernel family (the ≤ 8-row and wide Gluon
    mma.sync kernels, the 64-row Gluon kernel, the Triton kernel), captured in a CUDA graph and
    replayed with new lengths and contents, the result still matches the reference — the
    combine reads every split's finished partials."""

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the launcher takes programmatic dependent launch on SM90 only")
    monkeypatch.setattr(decode_mod, "PDL", True)
    plan = _graph_replays(fmt, heads)
    assert plan.num_splits > 1 and plan._pdl  # the combine ran, as a dependent launch


def _graph_replays(fmt, heads=16, s_q=1):
    lens = [3000, 700, 64]
    cache, table, seqlens = paged_cache(fmt, [4096] * 3, 64, device="cuda", seed=3)
    seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
    q = torch.randn(3, s_q, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=3, num_heads=heads, s_q=s_q, kv_format=cache.fmt, page_size=64,
                      max_seqlen=4096, device="cuda")
    plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0), check=False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0),
                            check=False)
    for step, new_lens in enumerate(([3001, 701, 65], [4096, 1, 0], [17, 2500, 4000])):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q.float()).bfloat16())
        # rewrite every request's rows: contents change under the graph
        pos = torch.arange(4096, device="cuda")
        for b in range(3):
            slots = table[b, pos // 64].long() * 64 + pos % 64
            cache.store(0, torch.randn(4096, 512, device="cuda").bfloat16(),
                        torch.randn(4096, 64, device="cuda").bfloat16(), slots)
        graph.replay()
        ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
        assert_close(out, ro, name=f"replay {step} out")
        assert_close(lse, rl, atol=1e-3, rtol=1e-3, name=f"replay {step} lse")
    return plan


@pytest.mark.parametrize("fmt,heads,s_q", [("fp8", 8, 1), ("fp8", 16, 1), ("fp8_ds_mla", 8, 1),
                                           ("fp8_ds_mla", 16, 2), ("fp8_ds_mla", 32, 1),
                                           ("fp8", 16, 2), ("fp8", 32, 1),  # head blocks
                                           ("fp8", 128, 1), ("fp8_ds_mla", 128, 1),
                                           ("fp8", 16, 4), ("fp8_ds_mla", 16, 4)])  # packed
def test_pool_off_16_byte_boundary_falls_back(fmt, heads, s_q, monkeypatch):
    """A pool whose first row is not 16-byte aligned cannot be described for TMA nor copied
    16 bytes at a time: a plan of the ≤ 16-row kernels (8 rows, the wide forms, fp8_ds_mla
    head blocks) or of the 64-row kernels (4 splits: their bf16 partials then stored by the
    Triton kernel, which would have taken float32) hands that call to the Triton kernel with
    its own config (fp8 head blocks forced: `SM90_MMA16_FP8_HEAD_BLOCKS`), and the result
    matches the reference; the same plan then serves the aligned pool on its own kernel."""
    _mma16_only(monkeypatch, qk8=True)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", True)
    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)  # (33–64 rows: s_q 4 × 16 heads)
    lens = [3000, 65, 0]
    cache, table, seqlens = paged_cache(fmt, lens, 64,
                                        policy="pow2" if fmt == "fp8_ds_mla" else None,
                                        device="cuda", seed=heads + s_q)
    pool = cache.layer(0).view(torch.uint8)
    shifted = torch.empty(pool.numel() + 8, dtype=torch.uint8, device="cuda")[8:].view(
        pool.shape)
    shifted.copy_(pool)
    assert shifted.data_ptr() % 16 == 8 and pool.data_ptr() % 16 == 0
    q = torch.randn(len(lens), s_q, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=64, cache_seqlens=seqlens, device="cuda",
                      num_splits=4 if heads * s_q > 32 else None)
    if heads * s_q > 32:
        assert plan.kernel == "sm90" and plan.part_out.dtype == torch.bfloat16
        assert plan.packed == (heads * s_q <= 64)
    else:
        assert plan.mma8 and plan.head_blocks == (2 if heads * s_q > 16 else 1)
        assert plan.qk8 == (heads * s_q > 8)  # the wide forms' FP8 product, switched on
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    for rows in (shifted, pool):
        out, lse = plan.run(q, rows, table, seqlens, fp8_scale=cache.scale(0))
        assert_close(out, ro, name="out")
        assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt,heads,s_q,splits,kernel", [
    ("fp8", 4, 2, None, "mma8"), ("fp8", 8, 2, 3, "mma16"), ("fp8_ds_mla", 4, 2, None, "mma8"),
    ("fp8_ds_mla", 8, 2, None, "mma16"), ("fp8_ds_mla", 16, 2, 3, "mma16"),  # head blocks
    ("fp8_ds_mla", 4, 4, 1, "mma16"), ("bf16", 8, 2, None, "triton"),
    ("fp8", 32, 4, None, "triton"),  # 32 heads: 32-row programs, not the 64-head kernels
    ("fp8", 16, 4, 3, "sm90"), ("fp8_ds_mla", 16, 4, None, "sm90"),  # packed (forced on)
])
def test_blind_query_rows(fmt, heads, s_q, splits, kernel, monkeypatch):
    """Causal MTP over requests shorter than s_q: a query that sees no token gets zeros, lse
    ``empty_lse`` (−inf, or +inf where asked) and max_logits −inf on every kernel, one split or
    several (the combine); the request's other queries and the other requests match the
    reference."""
    _mma16_only(monkeypatch)
    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)  # (33–64 rows alone)
    lens = [1, 3000, s_q - 1, 2]
    cache, table, seqlens = paged_cache(fmt, lens, 64,
                                        policy="pow2" if fmt == "fp8_ds_mla" else None,
                                        device="cuda", seed=heads + s_q)
    q = torch.randn(len(lens), s_q, heads, 576, device="cuda").bfloat16()
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=64, cache_seqlens=seqlens, device="cuda", num_splits=splits)
    assert plan.kernel == kernel, plan.kernel
    assert plan.packed == (kernel == "sm90")  # (the 64-row cases: s_q 4 × 16 heads)
    kv = cache.dequantize(0)
    ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
    run = functools.partial(plan.run, q, cache.layer(0), table, seqlens,
                            fp8_scale=cache.scale(0))
    out, lse = run()
    assert_close(out, ro, name="out")  # blind rows: zeros on both sides
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")  # blind rows: −inf on both
    _check_max_logits(plan, q, kv, table, lens, 64)
    blind = assert_blind_rows(plan, run, lens, out, lse)
    assert blind.any() and not blind.all()
