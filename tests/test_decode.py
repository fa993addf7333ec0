"""Dense decode against the float32 reference: odd shapes, every format, poisoned pools."""

import functools

import pytest
import torch

import fp8mla.decode as decode_mod
from fp8mla import reference
from fp8mla.decode import DecodePlan, choose_num_splits, dense_decode
from fp8mla.sparse import SparsePlan, sparse_decode
from fp8mla.testing import assert_close
from helpers import LaunchRecorder, assert_blind_rows, paged_cache

FORMATS = [("bf16", None), ("fp8", None), ("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32")]

# (heads, s_q, lens, page_size, num_splits); num_splits None = the scheduler's choice
CPU_CASES = [
    (1, 1, [63], 16, None),
    (3, 1, [65, 1, 0], 16, None),
    (8, 2, [100, 7], 1, 3),
    (16, 4, [200], 64, 2),
    (5, 3, [64, 2, 130], 64, 5),
    (16, 2, [300, 129, 0], 16, 1),  # 32 rows: several 128-token tiles per program on SM90 FP8
    (64, 1, [19, 0], 16, 2),
    (128, 1, [40], 64, None),
]


def _q(batch, s_q, heads, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, s_q, heads, 576, generator=g).bfloat16().to(device)


def _check(cache, table, seqlens, q, out, lse, scale, policy=None, folded=True):
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, scale)
    assert_close(out, ro, name="out")
    # fp8_ds_mla's fp32-policy scales: folded into the float32 scores and P at ≤ 16 rows per
    # program; above, applied to the fp16 tile in fp16 (kernels/decode.py): ≈ 2⁻¹⁰ relative
    # per element, lse errors up to ~1.1e-3 measured here (pow2: exact, ~5e-7)
    atol = 3e-3 if policy == "fp32" and not folded else 1e-3
    assert_close(lse, rl, atol=atol, rtol=1e-3, name="lse")


def _dense_plan(heads=8, s_q=1, page_size=64, fmt="fp8", batch=1, ctx=131072, splits=None,
                **kw):
    """A dense plan built on the CPU (the serving-rule tests fake an SM90 target)."""
    return DecodePlan(batch=batch, num_heads=heads, s_q=s_q, kv_format=fmt, page_size=page_size,
                      max_seqlen=ctx, device="cpu", num_splits=splits, **kw)


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("heads,s_q,lens,page_size,splits", CPU_CASES)
def test_decode_matches_reference(device, fmt, policy, heads, s_q, lens, page_size, splits):
    seed = hash((fmt, policy, heads, s_q, tuple(lens), page_size)) % 2**31
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device=device,
                                        seed=seed)
    q = _q(len(lens), s_q, heads, device, seed + 1)
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=page_size, cache_seqlens=seqlens, softmax_scale=0.06,
                      device=device, num_splits=splits)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    rows = plan.config.heads_per_block * (1 << (s_q - 1).bit_length())
    _check(cache, table, seqlens, q, out, lse, 0.06, policy, folded=rows <= 16)


def test_zero_length_gives_zeros_and_minus_inf(device):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [0, 5], 16, device=device)
    q = _q(2, 1, 4, device, 0)
    out, lse = dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8_ds_mla")
    assert torch.all(out[0] == 0)
    assert torch.all(lse[0] == float("-inf"))
    assert torch.all(lse[1].isfinite())


@pytest.mark.parametrize("fmt,policy", FORMATS[1:])
def test_stored_nan_reaches_the_attention_output(device, fmt, policy):
    """A NaN stored in one request's row makes that request's dense and sparse attention NaN
    and leaves the other request's finite, on every conversion path (the software one, SM80's
    and the interpreter's, read e4m3fn's NaN code as 480 before)."""
    def rows(b, lat, rope):
        if b == 0:
            lat[3, 100] = float("nan")
        return lat, rope

    cache, table, seqlens = paged_cache(fmt, [9, 12], 4, policy=policy, device=device,
                                        rows=rows)
    q = _q(2, 1, 3, device, 5)
    out, _ = dense_decode(q, cache.layer(0), table, seqlens, kv_format=cache.fmt,
                          fp8_scale=cache.scale(0))
    assert out[0].isnan().all() and out[1].isfinite().all()
    pos = torch.arange(9, device=device)
    slots = (table[:, pos // 4].long() * 4 + pos % 4).int().unsqueeze(1)  # [2, 1, 9]
    out, _ = sparse_decode(q, cache.layer(0), slots, kv_format=cache.fmt,
                           fp8_scale=cache.scale(0))
    assert out[0].isnan().all() and out[1].isfinite().all()


@pytest.mark.parametrize("splits", [1, 3])
def test_nan_in_q_gives_nan_in_that_row_alone(device, splits):
    """A NaN in one query head's q makes that row's output and lse NaN, as the reference's, on
    one split, through the split combine and in sparse decode (the lse was −inf before, the
    marker of a row that attended nothing); every other row stays finite."""
    cache, table, seqlens = paged_cache("fp8_ds_mla", [40, 33], 16, device=device, seed=3)
    q = _q(2, 2, 5, device, 4)
    q[1, 0, 2, 7] = float("nan")
    plan = DecodePlan(batch=2, num_heads=5, s_q=2, kv_format=cache.fmt, page_size=16,
                      cache_seqlens=seqlens, device=device, num_splits=splits)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    want = torch.zeros(2, 2, 5, dtype=torch.bool)
    want[1, 0, 2] = True
    assert torch.equal(lse.isnan().cpu(), want)
    assert torch.equal(out.isnan().any(-1).cpu(), want) and out[1, 0, 2].isnan().all()
    assert lse[~want.to(device)].isfinite().all()
    pos = torch.arange(33, device=device)
    slots = (table[:, pos // 16].long() * 16 + pos % 16).int()[:, None].expand(2, 2, 33)
    out, lse = sparse_decode(q, cache.layer(0), slots.contiguous(), kv_format=cache.fmt,
                             fp8_scale=cache.scale(0))
    assert torch.equal(lse.isnan().cpu(), want) and out[1, 0, 2].isnan().all()


def test_plan_without_own_outputs_writes_what_it_is_given(device):
    """own_outputs=False: no out / lse buffers in the plan (the compat layers' and the layer's
    plans, whose callers always pass fresh ones); runs given outputs match a plan of its own
    bit for bit, split and not; a run given none is refused by name, and a sparse plan alike."""
    cache, table, seqlens = paged_cache("fp8_ds_mla", [90, 7], 16, device=device, seed=21)
    q = _q(2, 2, 5, device, 22)
    for splits in (1, 3):
        kw = dict(batch=2, num_heads=5, s_q=2, kv_format=cache.fmt, page_size=16,
                  max_seqlen=96, device=device, num_splits=splits)
        bare, own = DecodePlan(own_outputs=False, **kw), DecodePlan(**kw)
        assert bare.out is None and bare.lse is None and bare.max_logits.shape == (2, 2, 5)
        out = torch.empty(2, 2, 5, 512, dtype=torch.bfloat16, device=device)
        lse = torch.empty(2, 2, 5, dtype=torch.float32, device=device)
        bare.run(q, cache.layer(0), table, seqlens, out=out, lse=lse)
        want_out, want_lse = own.run(q, cache.layer(0), table, seqlens)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
        with pytest.raises(ValueError, match=r"out: expected a tensor \(the plan was made with "
                                             r"own_outputs=False"):
            bare.run(q, cache.layer(0), table, seqlens)
        with pytest.raises(ValueError, match=r"lse: expected a tensor"):
            bare.run(q, cache.layer(0), table, seqlens, out=out)
    sparse = SparsePlan(num_queries=2, num_heads=5, topk=8, kv_format=cache.fmt, device=device,
                        own_outputs=False)
    with pytest.raises(ValueError, match=r"out: expected a tensor"):
        sparse.run(q[:, 0], cache.layer(0), torch.zeros(2, 8, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match=r"own_outputs: expected a bool, got str"):
        DecodePlan(own_outputs="no", **kw)


@pytest.mark.parametrize("backend", ["full_cast", "gather_cast", "reference"])
@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla", "bf16"])
def test_baselines_match_reference(device, backend, fmt):
    cache, table, seqlens = paged_cache(fmt, [70, 3], 16, device=device, seed=7)
    q = _q(2, 2, 3, device, 8)
    out, lse = dense_decode(q, cache.layer(0), table, seqlens, kv_format=fmt,
                            fp8_scale=cache.scale(0), backend=backend)
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5)


def test_scheduler_fills_whole_waves_without_tiny_splits():
    # H200: 132 SMs × 2 programs each = 264 slots
    assert choose_num_splits(1, 1, 131072, 264) == 256  # B=1 at 128K: capped at MAX_SPLITS
    assert choose_num_splits(64, 1, 8192, 264) == 4  # 256 programs: one wave (5 would be 1.2)
    assert choose_num_splits(64, 2, 8192, 132) == 1  # 128 programs on 132 one-program SMs
    assert choose_num_splits(64, 2, 8192, 264) == 2
    assert choose_num_splits(1, 1, 300, 264) == 5  # one 64-token tile per split at most
    assert choose_num_splits(1, 1, 4096, 264) == 64  # a short lone request: one tile each
    assert choose_num_splits(256, 1, 100, 264) == 1
    # more programs than slots: a few splits balance the last wave, not dozens
    assert 1 < choose_num_splits(300, 1, 8192, 264) <= 8


def test_combine_blocks_spread_few_rows_over_the_gpu():
    from fp8mla.decode import combine_blocks

    assert combine_blocks(8, 256, 132) == (16, 256)  # B=1, 8 heads, 128K: 256 programs, 1 step
    assert combine_blocks(8, 128, 132) == (32, 128)
    assert combine_blocks(8, 64, 132) == (32, 64)  # the pool case: every split in one step
    assert combine_blocks(64 * 16, 4, 132) == (512, 4)  # B=64 H=16: whole rows, one step
    assert combine_blocks(64 * 64, 256, 132) == (512, 8)
    assert combine_blocks(48, 256, 132) == (64, 64)  # 384 programs at 64 dims


def test_combine_in_narrow_dim_blocks(device, monkeypatch):
    """The combine with 32-dim programs and several split steps (as for one long request on a
    GPU) matches the reference."""
    monkeypatch.setattr(decode_mod, "COMBINE_PROGRAMS_PER_SM", 1 << 20)  # always 32 dims
    monkeypatch.setattr(decode_mod, "COMBINE_TILE", 32 * 4)  # 4 splits per step
    cache, table, seqlens = paged_cache("fp8", [150, 20], 16, device=device, seed=5)
    q = _q(2, 1, 3, device, 6)
    plan = DecodePlan(batch=2, num_heads=3, kv_format="fp8", page_size=16,
                      cache_seqlens=seqlens, device=device, num_splits=5)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5)


def test_sm90_gluon_kernel_rule(monkeypatch):
    """Which plans the 64-row Gluon SM90 kernels serve (`DecodePlan._sm90_form`): 64-head
    programs (more than 32 heads), compute capability 9.0, the launcher's own configuration;
    the TMA kernel dense fp8 rows in pages of ≥ 64 tokens (`SM90_GLUON`); the gather kernel
    dense fp8_ds_mla rows in pages of any size (`SM90_DS_PAGED`), dense fp8 rows in shorter
    pages and sparse fp8 lists (`SM90_GATHER_FP8`), sparse fp8_ds_mla lists
    (`SPARSE_SM90_GLUON`); dense s_q 2–4 a program a query (`SM90_MTP`). (The kernels run on
    the GPU only: tests/test_decode_gpu.py, test_sparse_gpu.py; their sm_90 compiles:
    tests/test_portability.py.)"""
    from fp8mla.kernels import decode_sm90
    from fp8mla.runtime import DecodeConfig, Target
    from fp8mla.sparse import SparsePlan

    if not decode_sm90.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    cc = {"value": 90}
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(cc["value"], 132))

    def form(fmt="fp8", heads=128, s_q=1, page_size=64, sparse=False, queries=40, **kw):
        """The plan's kernel, and the 64-row form where that is "sm90"."""
        if sparse:
            plan = SparsePlan(num_queries=queries, num_heads=heads, topk=256, kv_format=fmt,
                              device="cpu", **kw)
        else:
            plan = DecodePlan(batch=2, num_heads=heads, s_q=s_q, kv_format=fmt,
                              page_size=page_size, max_seqlen=4096, device="cpu", **kw)
        return (plan.kernel, plan._sm90_form()) if plan.kernel == "sm90" else (plan.kernel,)

    tma, gather = ("sm90", "tma"), ("sm90", "gather")
    sds = dict(sparse=True, fmt="fp8_ds_mla")
    want = [
        (dict(), tma), (dict(heads=33), tma), (dict(page_size=256), tma),
        (dict(page_size=32), gather), (dict(page_size=1, heads=65), gather),  # short pages
        (dict(s_q=2), tma), (dict(s_q=4, heads=33), tma), (dict(s_q=3, page_size=16), gather),
        (dict(heads=32), ("triton",)),  # 32-row programs
        (dict(fmt="bf16"), ("triton",)),
        (dict(fmt="fp8_ds_mla"), gather), (dict(fmt="fp8_ds_mla", page_size=1), gather),
        (dict(fmt="fp8_ds_mla", heads=33, page_size=256, s_q=2), gather),
        (dict(fmt="fp8_ds_mla", heads=32), ("mma16",)),  # head blocks of the ≤ 16-row kernel
        (sds, gather), (dict(sds, heads=64), gather),
        (dict(sparse=True), gather),  # fp8 lists
        (dict(sds, heads=32), gather), (dict(sds, heads=16), ("triton",)),
        (dict(sparse=True, fmt="bf16"), ("triton",)),
        (dict(config=DecodeConfig(block_n=64, heads_per_block=64, num_warps=8, num_stages=3,
                                  tma=True)), ("triton",)),  # an explicit configuration
    ]
    for kw, kernel in want:
        assert form(**kw) == kernel, kw
    plan = DecodePlan(batch=2, num_heads=128, kv_format="fp8", page_size=64, max_seqlen=4096,
                      device="cpu")
    assert plan.programs_per_sm == 1  # 225 KB of shared memory: one program per SM
    from fp8mla.bench.harness import kernel_note  # what the benchmarks' records say

    assert kernel_note(plan).startswith("kernel=sm90 splits=")
    assert kernel_note(plan).endswith(" form=tma rows_in_order=True")
    monkeypatch.setattr(decode_mod, "SM90_ROWS_IN_ORDER", False)
    assert kernel_note(plan).endswith(" rows_in_order=False")
    # SM90_PACKED: every query's heads in one 64-row program where they fit (33–64 rows)
    assert form(s_q=4, heads=16) == ("triton",)  # off by default (not yet run on a GPU)
    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)
    for kw, kernel, packed in (
            (dict(s_q=4, heads=16), tma, True), (dict(s_q=2, heads=32), tma, True),
            (dict(s_q=3, heads=11), tma, True),  # 33 rows
            (dict(s_q=4, heads=16, page_size=16), gather, True),  # fp8 in short pages
            (dict(s_q=2, heads=20, fmt="fp8_ds_mla", page_size=1), gather, True),
            (dict(s_q=2, heads=33), tma, False),  # 66 rows: a query's heads a program
            (dict(s_q=2, heads=16, fmt="fp8_ds_mla"), ("mma16",), False),  # 32 rows: mma16
            (dict(s_q=3, heads=10), ("triton",), False),  # 30 rows
            (dict(s_q=4, heads=16, fmt="bf16"), ("triton",), False)):
        plan = DecodePlan(batch=2, num_heads=kw.get("heads", 128), s_q=kw.get("s_q", 1),
                          kv_format=kw.get("fmt", "fp8"), page_size=kw.get("page_size", 64),
                          max_seqlen=4096, device="cpu")
        assert form(**kw) == kernel and plan.packed == packed, kw
        assert ("packed=True" in kernel_note(plan)) == packed, kw
        if packed:  # one program a request and split, whatever s_q
            assert plan._query_blocks == 1, kw
    monkeypatch.setattr(decode_mod, "SM90_PACKED", False)
    mtp = DecodePlan(batch=2, num_heads=100, s_q=3, kv_format="fp8", page_size=64,
                     max_seqlen=4096, device="cpu")  # one query's 64 heads a program
    assert mtp.kernel == "sm90" and mtp._query_blocks == 2 * 3
    assert mtp.head_blocks == 7 and mtp.config.heads_per_block == 16  # (the Triton fallback's)
    # each switch off: its plans go back to the Triton kernel, the others stay
    for switch, off, kept in (
            ("SM90_MTP", dict(s_q=2), dict()),
            ("SM90_GLUON", dict(), dict(page_size=32)),
            ("SM90_DS_PAGED", dict(fmt="fp8_ds_mla"), dict()),
            ("SM90_GATHER_FP8", dict(page_size=32), dict(fmt="fp8_ds_mla")),
            ("SM90_GATHER_FP8", dict(sparse=True), sds),
            ("SPARSE_SM90_GLUON", sds, dict(fmt="fp8_ds_mla"))):
        monkeypatch.setattr(decode_mod, switch, False)
        assert form(**off) == ("triton",) and form(**kept)[0] == "sm90", (switch, off, kept)
        monkeypatch.setattr(decode_mod, switch, True)
    # sparse plans from SPARSE_SM90_MIN_HEADS (17) on: part-empty 64-head programs below 64
    assert form(**dict(sds, heads=17)) == gather and form(**dict(sds, heads=48)) == gather
    assert form(**dict(sds, heads=16)) == ("triton",) == form(heads=16, sparse=True)
    # ... and fp8_ds_mla lists of 9–16 heads for at most SPARSE_SM90_SMALL_BATCH (32) queries
    for heads, queries, want_form in ((16, 32, gather), (9, 1, gather), (16, 33, ("triton",)),
                                      (8, 2, ("mma8",))):
        assert form(**dict(sds, heads=heads, queries=queries)) == want_form, (heads, queries)
    assert form(heads=16, sparse=True, queries=2) == ("triton",)  # fp8 lists: not measured faster
    # a batch-invariant plan's kernel does not follow the batch size (one split a query)
    for queries in (1, 32, 33):
        assert form(**dict(sds, heads=16, queries=queries, batch_invariant=True)) == ("triton",)
    assert form(**dict(sds, heads=17, queries=2, batch_invariant=True)) == gather
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_SMALL_BATCH", 0)
    assert form(**dict(sds, heads=16, queries=2)) == ("triton",)
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_SMALL_BATCH", 32)
    # the Gluon kernels' 64-token tiles schedule the splits (the config's 32 at 17–32 heads
    # would leave half the programs of a short batch empty)
    short = SparsePlan(num_queries=1, num_heads=32, topk=2048, kv_format="fp8_ds_mla",
                       device="cpu")
    assert short.kernel == "sm90" and short.config.block_n == 32
    assert short._tile_tokens() == 64 and short.num_splits <= 2048 // 64
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_MIN_HEADS", 64)
    assert form(**dict(sds, heads=48)) == ("triton",) and form(**sds) == gather
    cc["value"] = 100
    assert form() == ("triton",)


def test_mma8_sm90_kernel_serves_where_documented(monkeypatch):
    """The Gluon SM90 kernel of ≤ 8-row programs (`SM90_MMA8`) serves fp8 dense plans of
    s_q × heads ≤ 8 over pages of ≥ 64 tokens, one program for all heads, split in its 64-token
    tiles with its programs per SM; it takes precedence over the ≤ 16-row kernel."""
    from fp8mla.kernels import decode_sm90_mma8 as k8
    from fp8mla.runtime import Target

    if not k8.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))

    dense = _dense_plan

    monkeypatch.setattr(decode_mod, "SM90_MMA8", True)
    monkeypatch.setattr(decode_mod, "SM90_MMA16", False)  # 16 rows: the Triton kernel here
    plan = dense()
    assert plan.mma8 and plan.sm90 and plan.head_blocks == 1
    per_sm = k8.programs_per_sm(k8.ROWS, k8.STAGES)
    assert plan.programs_per_sm == per_sm == 2 and plan.ring_stages == k8.STAGES == 3
    assert plan.num_splits == decode_mod.choose_num_splits(1, 1, 131072, 132 * per_sm,
                                                           k8.BLOCK_N)
    assert dense(heads=4, s_q=2).mma8 and dense(heads=2, s_q=4).mma8 and dense(heads=1).mma8
    assert not dense(heads=16).mma8  # 16 rows: the wide form's, off here
    assert not dense(heads=3, s_q=3).mma8  # 9 rows
    assert not dense(page_size=32).mma8  # a 64-token box would span pages
    assert not dense(fmt="bf16").mma8
    assert plan.kernel == "mma8" and dense(heads=16).kernel == "triton"
    monkeypatch.setattr(decode_mod, "SM90_MMA8", False)
    assert not dense().mma8


def test_mma16_sm90_kernel_serves_where_documented(monkeypatch):
    """The ≤ 16-row kernel's wide form (`SM90_MMA16`) serves fp8 dense plans of 9–16 query
    rows over pages of ≥ 64 tokens (the 8-row form keeps ≤ 8) whose schedule gives programs
    `mma16_min_tiles()` tiles or more (forced split counts included; 16, none on triton 3.8
    where its Triton kernel is slower), its ring of
    `SM90_MMA16_STAGES` stages deciding the programs per SM; fp8_ds_mla plans take theirs
    (`SM90_MMA16_DS`, ring of `SM90_MMA8_DS_STAGES`) from `SM90_MMA16_DS_MIN_TILES` tiles,
    sparse ones stay at ≤ 8 rows; off, the Triton kernel serves 16 rows."""
    from fp8mla.kernels import decode_sm90_mma8 as k8
    from fp8mla.runtime import Target

    if not k8.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))

    dense = functools.partial(_dense_plan, heads=16, batch=64, ctx=8192)

    monkeypatch.setattr(decode_mod, "SM90_MMA8", True)
    assert decode_mod.SM90_MMA16 and decode_mod.SM90_MMA16_MIN_TILES is None  # the defaults
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.9.0")
    for stages, per_sm in ((2, 2), (3, 1)):
        monkeypatch.setattr(decode_mod, "SM90_MMA16_STAGES", stages)
        plan = dense()
        assert plan.kernel == "mma16" and plan.mma_rows == 16 and plan.head_blocks == 1
        assert plan.ring_stages == stages and plan.programs_per_sm == per_sm
        assert plan.num_splits == decode_mod.choose_num_splits(64, 1, 8192, 132 * per_sm,
                                                               k8.BLOCK_N)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_STAGES", 2)
    assert dense().num_splits == 4  # 32 tiles a program
    from fp8mla.bench.harness import kernel_note  # what the benchmarks' records say

    assert kernel_note(dense()).startswith("kernel=mma16 splits=4 rows=16 ring=2 ")
    assert dense(heads=8, s_q=2).kernel == dense(heads=3, s_q=3).kernel == "mma16"
    assert dense(batch=32).kernel == "mma16"  # 8 splits: 16 tiles a program
    assert dense(batch=16).kernel == dense(batch=1, ctx=131072).kernel == "triton"  # 8 tiles
    assert dense(splits=16).kernel == "triton" and dense(batch=16, splits=8).kernel == "mma16"
    assert dense(heads=8).kernel == "mma8" and dense(heads=8).ring_stages == k8.STAGES
    assert dense(heads=8, batch=1, ctx=131072).kernel == "mma8"  # no length rule at ≤ 8 rows
    assert not dense(heads=17).mma8 and not dense(heads=8, s_q=3).mma8  # 17 / 24 rows
    assert not dense(page_size=32).mma8
    assert dense(heads=8, fmt="fp8_ds_mla").kernel == "mma8"
    assert decode_mod.SM90_MMA16_DS  # the fp8_ds_mla wide form: on by default
    ds = dense(fmt="fp8_ds_mla")
    assert ds.kernel == "mma16" and ds.mma_rows == 16 and ds.programs_per_sm == 2
    assert ds.ring_stages == decode_mod.SM90_MMA8_DS_STAGES == 2
    assert decode_mod.SM90_MMA16_DS_MIN_TILES == 0  # measured: the ds form wins at 1–8 tiles
    assert dense(fmt="fp8_ds_mla", batch=16).kernel == "mma16"  # 8 tiles a program
    assert dense(fmt="fp8_ds_mla", batch=1, ctx=131072).kernel == "mma16"
    assert dense(fmt="fp8_ds_mla", batch=1, ctx=4096).kernel == "mma16"  # 1 tile
    monkeypatch.setattr(decode_mod, "SM90_MMA16_DS_MIN_TILES", 8)
    assert dense(fmt="fp8_ds_mla", batch=8).kernel == "triton"  # 4 tiles
    monkeypatch.setattr(decode_mod, "SM90_MMA16_DS_MIN_TILES", 0)
    assert kernel_note(ds).startswith("kernel=mma16 splits=4 rows=16 ring=2 ")
    # the first product as FP8 wgmma: off by default (its precision: session 25); switched
    # on, the fp8 wide form for programs of ≥ 32 tiles, the fp8_ds_mla wide form always,
    # neither 8-row form
    assert not (decode_mod.SM90_MMA16_QK8 or decode_mod.SM90_MMA8_DS_QK8
                or decode_mod.SPARSE_SM90_MMA8_QK8)
    assert not dense().qk8 and not ds.qk8
    for on in ({"fp8_scores": True}, None):  # per plan, or the module's switches
        if on is None:
            monkeypatch.setattr(decode_mod, "SM90_MMA16_QK8", True)
            monkeypatch.setattr(decode_mod, "SM90_MMA8_DS_QK8", True)
            on = {}
        assert dense(**on).qk8 and not dense(batch=32, **on).qk8 and not dense(heads=8, **on).qk8
        assert dense(fmt="fp8_ds_mla", **on).qk8
        assert not dense(heads=8, fmt="fp8_ds_mla", **on).qk8
    assert not dense(fp8_scores=False).qk8 and not dense(fmt="fp8_ds_mla", fp8_scores=False).qk8
    with pytest.raises(TypeError, match="fp8_scores: expected a bool or None, got int"):
        dense(fp8_scores=1)
    # fp8_ds_mla plans of 17–32 rows: the wide form in head blocks of 16 // s_q heads
    mtp = dense(fmt="fp8_ds_mla", s_q=2)
    assert mtp.kernel == "mma16" and mtp.head_blocks == 2 and mtp.config.heads_per_block == 8
    assert mtp.mma_rows == 16 and mtp.qk8
    assert mtp.num_splits == decode_mod.choose_num_splits(64, 2, 8192, 264, k8.BLOCK_N)
    assert dense(fmt="fp8_ds_mla", heads=32).head_blocks == 2
    assert dense(fmt="fp8_ds_mla", heads=8, s_q=4).config.heads_per_block == 4
    assert mtp.config == decode_mod.decode_config(90, "fp8_ds_mla", 8, 2)  # a 16-row program's
    assert dense(fmt="fp8_ds_mla", heads=10, s_q=3).kernel == "triton"  # 16 % s_q ≠ 0
    assert dense(fmt="fp8_ds_mla", heads=24).kernel == "triton"  # 24 % 16 heads ≠ 0
    assert dense(fmt="fp8_ds_mla", heads=12, s_q=2).kernel == "triton"  # 12 % 8 heads
    assert dense(fmt="fp8_ds_mla", heads=64).kernel != "mma16"  # > 32 rows
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", False)  # (on 3.8: blocks)
    assert dense(s_q=2).kernel == "triton"  # fp8 at 32 rows, 2 splits: the Triton kernel's
    monkeypatch.setattr(decode_mod, "SM90_MMA16_DS_HEAD_BLOCKS", False)
    assert dense(fmt="fp8_ds_mla", s_q=2).kernel == "triton"
    monkeypatch.setattr(decode_mod, "SM90_MMA8_DS_STAGES", 3)
    assert dense(fmt="fp8_ds_mla").programs_per_sm == 1  # 146 KB
    for version, least in (("3.6.0", 16), ("3.8.0", 0), ("3.8.1+git1", 0), ("3.10.0", 16)):
        monkeypatch.setattr(decode_mod.triton, "__version__", version)
        assert decode_mod.mma16_min_tiles() == least, version
        # 8 tiles a program; B=1 × 4K: 1
        for case in (dict(batch=16), dict(batch=1, ctx=4096), dict(heads=8, s_q=2, batch=8)):
            assert dense(**case).kernel == ("mma16" if least == 0 else "triton"), (version, case)
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.9.0")
    monkeypatch.setattr(decode_mod, "SM90_MMA16_MIN_TILES", 0)  # an int forces the rule
    assert dense(batch=16).kernel == "mma16" and decode_mod.mma16_min_tiles() == 0
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.8.0")
    monkeypatch.setattr(decode_mod, "SM90_MMA16_MIN_TILES", 16)
    assert dense(batch=16).kernel == "triton"
    monkeypatch.setattr(decode_mod, "SM90_MMA16_MIN_TILES", 0)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_DS", False)
    assert dense(fmt="fp8_ds_mla").kernel == "triton" and dense().kernel == "mma16"
    monkeypatch.setattr(decode_mod, "SM90_MMA16", False)
    assert dense().kernel == "triton" and dense(heads=8).kernel == "mma8"


def test_fp8_head_blocks_serve_where_documented(monkeypatch):
    """Dense fp8 plans of 17–32 query rows (MTP s_q 2 × 16 heads, s_q 4 × 8, 32 heads) run the
    fp8 wide form in head blocks of 16 // s_q heads on triton 3.8 (the Triton kernel's 32-row
    fp8 program is 1.7× slower there) and, on other Tritons, where the blocks' schedule gives
    each request at least `SM90_MMA16_FP8_HEAD_BLOCKS_MIN_SPLITS` splits (measured faster from
    4; slower at 2); `SM90_MMA16_FP8_HEAD_BLOCKS` forces either. The blocks' grid, config and
    timeline follow the head block."""
    from fp8mla.kernels import decode_sm90_mma8 as k8
    from fp8mla.runtime import Target

    if not k8.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))
    dense = functools.partial(_dense_plan, heads=16, batch=64, ctx=8192, s_q=2)

    assert decode_mod.SM90_MMA16_FP8_HEAD_BLOCKS is None  # the default: the rule below
    assert decode_mod.SM90_MMA16_FP8_HEAD_BLOCKS_MIN_SPLITS == 4
    for version in ("3.6.0", "3.8.0", "3.8.1+git1", "3.9.0", "3.10.0"):
        monkeypatch.setattr(decode_mod.triton, "__version__", version)
        on_38 = version.startswith("3.8")
        # B=64 × 8K: 2 splits a request; B=32: 4; B=1 × 128K × 32 heads: 128
        assert dense().kernel == ("mma16" if on_38 else "triton"), version
        assert dense(splits=3).kernel == ("mma16" if on_38 else "triton"), version
        assert dense(batch=32).kernel == dense(splits=4).kernel == "mma16", version
        assert dense(batch=32).num_splits == 4 and dense(batch=32).head_blocks == 2
        assert dense(batch=1, ctx=131072, heads=32, s_q=1).head_blocks == 2, version
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.9.0")
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS_MIN_SPLITS", 2)
    assert dense().kernel == "mma16"
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", True)
    mtp = dense()
    assert mtp.kernel == "mma16" and mtp.head_blocks == 2 and mtp.mma_rows == 16
    from fp8mla.bench.harness import kernel_note  # what the benchmarks' records say

    assert kernel_note(mtp).startswith("kernel=mma16 splits=2 rows=16 head_blocks=2 ring=2 ")
    assert mtp.config == decode_mod.decode_config(90, "fp8", 8, 2)  # a 16-row program's
    assert mtp.num_splits == decode_mod.choose_num_splits(64, 2, 8192, 264, k8.BLOCK_N)
    assert dense(heads=32, s_q=1).head_blocks == 2 and dense(heads=8, s_q=4).head_blocks == 2
    assert dense(heads=8, s_q=4).config.heads_per_block == 4
    assert dense(fmt="fp8_ds_mla").head_blocks == 2  # its own switch
    assert dense(heads=10, s_q=3).kernel == "triton"  # 16 % s_q ≠ 0
    assert dense(heads=24, s_q=1).kernel == "triton"  # 24 % 16 heads ≠ 0
    assert dense(heads=12).kernel == "triton"  # 12 % 8 heads ≠ 0
    assert dense(heads=32).kernel != "mma16"  # 64 rows
    assert dense(batch=1, ctx=4096).kernel == "triton"  # programs of 1 tile: the length rule
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.8.0")
    assert dense(batch=1, ctx=4096).kernel == "mma16"  # none on triton 3.8
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.9.0")
    assert dense(page_size=32).kernel == "triton"  # a 64-token box would span pages
    with pytest.raises(ValueError, match=r"timeline: expected shape \[256, 12\], got \[128, 12\]"):
        mtp.timeline = torch.zeros(mtp.batch * mtp.num_splits, 12, dtype=torch.int64)
        mtp._check_timeline()
    mtp.timeline = torch.zeros(2 * mtp.batch * mtp.num_splits, 12, dtype=torch.int64)
    mtp._check_timeline()
    monkeypatch.setattr(decode_mod, "SM90_MMA16", False)  # the wide form's own switch
    assert dense().kernel == "triton"
    monkeypatch.setattr(decode_mod, "SM90_MMA16", True)
    monkeypatch.setattr(decode_mod, "SM90_MMA16_FP8_HEAD_BLOCKS", False)
    monkeypatch.setattr(decode_mod.triton, "__version__", "3.8.0")
    assert dense().kernel == "triton"


def test_mma8_ds_sm90_kernel_serves_where_documented(monkeypatch):
    """The ≤ 8-row Gluon kernel over fp8_ds_mla pages (`SM90_MMA8_DS`) serves dense plans of
    s_q × heads ≤ 8 over pages of ≥ 64 tokens, its programs per SM from its ring depth
    (shared memory: 40 KB a stage and 8 KB of P); off, the Triton kernel serves them."""
    from fp8mla.kernels import decode_sm90_mma8_ds as kd
    from fp8mla.runtime import Target

    if not kd.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))

    dense = functools.partial(_dense_plan, fmt="fp8_ds_mla")

    monkeypatch.setattr(decode_mod, "SM90_MMA8_DS", True)
    assert decode_mod.SM90_MMA8_DS_STAGES == 2  # the default
    plan = dense()
    assert plan.mma8 and plan.sm90 and plan.kernel == "mma8" and plan.head_blocks == 1
    assert plan.ring_stages == 2 and plan.programs_per_sm == 2 == kd.programs_per_sm(2)  # 89 KB
    assert plan.num_splits == decode_mod.choose_num_splits(1, 1, 131072, 264, kd.BLOCK_N)
    monkeypatch.setattr(decode_mod, "SM90_MMA8_DS_STAGES", 3)
    assert dense().programs_per_sm == 1 == kd.programs_per_sm(3)  # 129 KB
    assert dense(heads=4, s_q=2).mma8 and dense(heads=1, s_q=4).mma8
    assert dense(heads=16).kernel != "mma8" != dense(heads=3, s_q=3).kernel  # > 8 rows
    assert not dense(heads=17).mma8
    assert not dense(page_size=32).mma8  # a 64-token box would span pages
    monkeypatch.setattr(decode_mod, "SM90_MMA8", False)  # the fp8 kernel's switch: its own
    assert dense().mma8 and not dense(fmt="fp8").mma8
    monkeypatch.setattr(decode_mod, "SM90_MMA8_DS", False)
    assert not dense().mma8 and dense().kernel == "triton"


def test_sparse_mma8_sm90_kernel_serves_where_documented(monkeypatch):
    """The sparse Gluon SM90 kernel of ≤ 8-row programs (`SPARSE_SM90_MMA8`) serves fp8_ds_mla
    index lists of ≤ 8 heads, checking entries itself (no compaction), its programs per SM
    from its ring depth (shared memory: 40 KB a stage); it takes precedence over the ≤ 16-head
    kernel."""
    from fp8mla.kernels import decode_sm90_mma8_sparse as km
    from fp8mla.runtime import Target
    from fp8mla.sparse import SparsePlan

    if not km.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))

    def sparse(heads=8, fmt="fp8_ds_mla", **kw):
        return SparsePlan(num_queries=64, num_heads=heads, topk=2048, kv_format=fmt,
                          device="cpu", **kw)

    monkeypatch.setattr(decode_mod, "SPARSE_SM90_MMA8", True)
    plan = sparse()
    assert plan.mma8 and plan.sm90 and not plan.compacts
    assert plan.head_blocks == 1 and plan.programs_per_sm == 2  # 2 stages: 85 KB
    assert not plan.qk8 and sparse(fp8_scores=True).qk8  # the FP8 first product: per plan
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_MMA8_STAGES", 3)
    assert sparse().programs_per_sm == 1 == km.programs_per_sm(3)  # 125 KB
    assert sparse(heads=1).mma8 and sparse(heads=5).mma8
    assert not sparse(heads=9).mma8 and not sparse(heads=16).sm90  # the Triton kernel's
    assert not sparse(fmt="fp8").mma8 and not sparse(fmt="bf16").mma8
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_MMA8", False)
    assert not sparse().mma8


def test_kernels_signal_the_combine_where_measured_faster(monkeypatch):
    """`PDL_SIGNAL`: on SM90 the Gluon decode kernels signal the split combine (a programmatic
    dependent) after their loop — the 8-row, fp8_ds_mla, 64-head and sparse kernels — but not
    the fp8 wide form (slower so on the H200), and none where no combine follows (one split).
    The launches are recorded, not run: a CPU test of what the launcher passes."""
    from fp8mla.kernels import decode_sm90 as k90
    from fp8mla.kernels import decode_sm90_mma8 as k8
    from fp8mla.kernels import decode_sm90_mma8_ds as kd
    from fp8mla.kernels import decode_sm90_mma8_sparse as km
    from fp8mla.runtime import Target
    from fp8mla.sparse import SparsePlan

    if not k8.AVAILABLE:
        pytest.skip("this Triton has no (such) Gluon")
    monkeypatch.setattr(decode_mod, "target_for", lambda device: Target(90, 132))
    calls = []
    for module, name in ((k8, "_mla_decode_mma8_kernel"), (kd, "_mla_decode_mma8_ds_kernel"),
                         (km, "_mla_sparse_mma8_kernel"), (k90, "_mla_decode_sm90_kernel"),
                         (k90, "_mla_sparse_sm90_kernel")):
        monkeypatch.setattr(module, name, LaunchRecorder(calls, name))
    gather = "_mla_sparse_sm90_kernel"  # (its PAGED and DS flags)
    launched = {  # (kernel, 64-row form, format, sparse) → the kernel launched, PAGED, DS
        ("mma8", None, "fp8", False): ("_mla_decode_mma8_kernel", None, None),
        ("mma16", None, "fp8", False): ("_mla_decode_mma8_kernel", None, None),
        ("mma8", None, "fp8_ds_mla", False): ("_mla_decode_mma8_ds_kernel", None, None),
        ("mma16", None, "fp8_ds_mla", False): ("_mla_decode_mma8_ds_kernel", None, None),
        ("sm90", "tma", "fp8", False): ("_mla_decode_sm90_kernel", None, None),
        ("sm90", "gather", "fp8", False): (gather, True, False),
        ("sm90", "gather", "fp8_ds_mla", False): (gather, True, True),
        ("mma8", None, "fp8_ds_mla", True): ("_mla_sparse_mma8_kernel", None, None),
        ("sm90", "gather", "fp8_ds_mla", True): (gather, False, True),
        ("sm90", "gather", "fp8", True): (gather, False, False)}

    def signals(plan):
        """The PDL flag the launcher passes (a CPU tensor stands for each GPU one), after
        checking which kernel it launched."""
        q, lse = torch.zeros(1, 1, 1, 576), torch.zeros(1, 1, 1)
        rows = torch.zeros(128, plan.fmt.row_bytes, dtype=torch.uint8)
        table, lens = torch.zeros(1, 64, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        plan._launch_sm90(q, rows, table, lens, lse[0, 0], q[..., :512], lse, float("-inf"),
                          plan.num_splits == 1)
        name, grid, meta = calls.pop()
        assert plan.sm90_form == (plan._sm90_form() if plan.kernel == "sm90" else None)
        assert (name, meta.get("PAGED"), meta.get("DS")) == launched[
            plan.kernel, plan.sm90_form, plan.fmt.name, plan.sparse]
        # grid: (requests, splits, head blocks — × s_q on the 64-row kernels, 1 packed)
        blocks = plan._query_blocks if plan.kernel == "sm90" else plan.head_blocks
        assert grid == (plan.batch, plan.num_splits, blocks)
        if plan.kernel == "sm90":  # every query's heads in one program, or one query's
            assert meta["PACK"] is plan.packed and meta["S_Q"] == plan.s_q
        return meta["PDL"]

    assert decode_mod.PDL_SIGNAL
    for fmt, heads, batch, ctx, kernel, want, page in (
            ("fp8", 8, 64, 8192, "mma8", True, 64), ("fp8", 16, 64, 8192, "mma16", False, 64),
            ("fp8_ds_mla", 8, 64, 8192, "mma8", True, 64),
            ("fp8_ds_mla", 16, 64, 8192, "mma16", True, 64),
            ("fp8", 128, 1, 131072, "sm90", True, 64), ("fp8", 128, 1, 131072, "sm90", True, 16),
            ("fp8_ds_mla", 128, 1, 131072, "sm90", True, 1)):
        kw = dict(heads=heads, fmt=fmt, batch=batch, ctx=ctx, page_size=page)
        plan = _dense_plan(**kw)
        assert plan.kernel == kernel and plan.num_splits > 1, (fmt, heads)
        assert signals(plan) is want, (fmt, heads)
        assert signals(_dense_plan(splits=1, **kw)) is False
    monkeypatch.setattr(decode_mod, "SM90_PACKED", True)  # s_q 4 × 16 heads: one program
    for fmt, page in (("fp8", 64), ("fp8", 16), ("fp8_ds_mla", 64)):
        plan = _dense_plan(heads=16, s_q=4, fmt=fmt, batch=64, ctx=8192, page_size=page)
        assert plan.packed and plan._query_blocks == 1 and signals(plan) is (
            plan.num_splits > 1), (fmt, page)
    monkeypatch.setattr(decode_mod, "SM90_PACKED", False)
    for heads, queries, kernel, fmt in ((8, 64, "mma8", "fp8_ds_mla"),
                                        (128, 4, "sm90", "fp8_ds_mla"), (64, 4, "sm90", "fp8")):
        plan = SparsePlan(num_queries=queries, num_heads=heads, topk=2048, kv_format=fmt,
                          device="cpu")
        assert plan.kernel == kernel and plan.num_splits > 1, heads
        assert signals(plan) is True, heads
    monkeypatch.setattr(decode_mod, "PDL_SIGNAL", False)
    assert signals(_dense_plan()) is False


def test_resident_programs_from_kernel_resources():
    from fp8mla.runtime import resident_programs

    assert resident_programs(90, 4, 255, 57344) == 2  # the fp8 H16 kernel: registers bound
    assert resident_programs(90, 4, 128, 94208) == 2  # bf16 at 64 tokens: shared memory bound
    assert resident_programs(90, 8, 246, 184320) == 1
    assert resident_programs(89, 4, 64, 16384) == 5  # 99 KB parts
    assert resident_programs(90, 4, 32, 0) == 16  # warps bound (64 per SM)


def test_plan_workspace_independent_of_pool_and_lengths(device):
    kw = dict(batch=2, num_heads=8, kv_format="fp8", page_size=16, device=device, num_splits=4)
    a = DecodePlan(max_seqlen=100, **kw)
    b = DecodePlan(max_seqlen=100_000, **kw)
    out_bytes = 2 if a.kernel in ("mma8", "mma16") else 4  # bf16 on the ≤ 16-row Gluon kernels
    assert a.workspace_bytes == b.workspace_bytes == 2 * 4 * 8 * (512 * out_bytes + 2 * 4)


@pytest.mark.parametrize("fmt,heads,s_q", [("fp8", 4, 1), ("fp8_ds_mla", 3, 2), ("bf16", 16, 1)])
def test_bf16_partials_match_reference(device, monkeypatch, fmt, heads, s_q):
    """Split partials stored in bfloat16 (`PARTIALS_BF16_MIN_SPLITS`: half the workspace) still
    match the reference at the bf16 output's tolerance, and their error stays within a few
    bf16 roundings of the float32 partials' result."""
    cache, table, seqlens = paged_cache(fmt, [300, 70, 0, 129], 16, device=device, seed=heads)
    q = _q(4, s_q, heads, device, 5)
    results = {}
    for bf16 in (False, True):
        monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", 3 if bf16 else 4)
        monkeypatch.setattr(decode_mod, "PARTIALS_BF16_EVERYWHERE", True)
        plan = DecodePlan(batch=4, num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                          page_size=16, cache_seqlens=seqlens, device=device, num_splits=3)
        assert plan.part_out.dtype == (torch.bfloat16 if bf16 else torch.float32)
        results[bf16] = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
        results[bf16, "bytes"] = plan.workspace_bytes
    assert results[True, "bytes"] == 4 * 3 * s_q * heads * (512 * 2 + 2 * 4)
    assert results[False, "bytes"] == 4 * 3 * s_q * heads * (512 + 2) * 4
    _check(cache, table, seqlens, q, *results[True], 576 ** -0.5)
    ro, _ = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    err = {k: (results[k][0].float() - ro).abs().max().item() for k in (False, True)}
    scale = ro.abs().max().item()
    assert err[True] <= err[False] + 3 * 2 ** -8 * scale, err  # one bf16 rounding more, at most


def test_partials_dtype_rule(monkeypatch):
    """`partials_dtype`: bfloat16 from `PARTIALS_BF16_MIN_SPLITS` (2) splits on the Gluon
    kernels (the 64-row ones while `SM90_ROWS_IN_ORDER` stores their rows 16 bytes a thread)
    and on the Triton kernel over bf16 rows at ≤ 32 rows a program, where it measured faster
    on the H200; float32 on the Triton kernel over FP8 rows (its compiles spill with bf16
    stores) and the 64-row kernels' accumulator stores."""
    assert decode_mod.PARTIALS_BF16_MIN_SPLITS == 2 and not decode_mod.PARTIALS_BF16_EVERYWHERE
    assert decode_mod.SM90_ROWS_IN_ORDER
    bf16 = {("mma8", "fp8", 8), ("mma8", "fp8_ds_mla", 16), ("mma16", "fp8", 16),
            ("mma16", "fp8_ds_mla", 16), ("triton", "bf16", 16), ("triton", "bf16", 32),
            ("sm90", "fp8", 64), ("sm90", "fp8_ds_mla", 64)}
    fp32 = {("triton", "bf16", 64), ("triton", "fp8", 16), ("triton", "fp8_ds_mla", 16),
            ("triton", "fp8", 32)}
    for splits in (2, 3, 16, 256):
        for key in bf16 | fp32:
            want = torch.bfloat16 if key in bf16 else torch.float32
            assert decode_mod.partials_dtype(splits, *key) == want, (splits, key)
    assert decode_mod.partials_dtype(1, "mma8", "fp8", 8) == torch.float32  # (no partials)
    monkeypatch.setattr(decode_mod, "SM90_ROWS_IN_ORDER", False)
    for fmt in ("fp8", "fp8_ds_mla"):
        assert decode_mod.partials_dtype(16, "sm90", fmt, 64) == torch.float32


def test_partials_bf16_in_split_plans(device):
    """Plans take `partials_dtype`'s rule with their own kernel and program rows — dense and
    sparse alike (here the Triton kernel: bf16 over bf16 rows of ≤ 32 rows a program); a
    17-split plan (a short request's splits empty past its length) matches the reference."""
    from fp8mla.sparse import SparsePlan

    kw = dict(batch=2, num_heads=4, kv_format="fp8", page_size=16, max_seqlen=2000,
              device=device)
    for splits in (2, 15, 16, 40):
        for fmt in ("bf16", "fp8", "fp8_ds_mla"):
            for heads, s_q in ((4, 1), (16, 1), (8, 2), (64, 1), (32, 2)):
                dense = DecodePlan(num_splits=splits, **{**kw, "num_heads": heads,
                                                         "kv_format": fmt}, s_q=s_q)
                sparse = SparsePlan(num_queries=2, num_heads=heads, topk=2048, kv_format=fmt,
                                    device=device, num_splits=splits)
                for plan in (dense, sparse):
                    want = decode_mod.partials_dtype(splits, plan.kernel, fmt, plan.block_rows)
                    assert plan.part_out.dtype == want, (splits, fmt, heads, s_q)
                assert dense.block_rows == max(16, heads * s_q)  # (64 rows a program at most)
                assert sparse.block_rows == max(16, heads)
                for plan, rows in ((dense, heads * s_q), (sparse, heads)):
                    if plan.kernel == "triton":  # (every plan here on the CPU)
                        rule = fmt == "bf16" and max(16, rows) <= 32
                        assert (plan.part_out.dtype == torch.bfloat16) == rule
    cache, table, seqlens = paged_cache("bf16", [600, 37], 16, device=device, seed=40)
    q = _q(2, 1, 4, device, 41)
    plan = DecodePlan(num_splits=17, **{**kw, "kv_format": "bf16"})
    assert plan.part_out.dtype == torch.bfloat16 or plan.kernel != "triton"
    _check(cache, table, seqlens, q, *plan.run(q, cache.layer(0), table, seqlens,
                                               fp8_scale=cache.scale(0)), 576 ** -0.5)


# --- bad input ------------------------------------------------------------------------------

@pytest.fixture
def small(device):
    cache, table, seqlens = paged_cache("fp8", [20, 9], 16, device=device)
    plan = DecodePlan(batch=2, num_heads=4, kv_format="fp8", page_size=16,
                      cache_seqlens=seqlens, device=device)
    return cache, table, seqlens, plan, _q(2, 1, 4, device, 1)


def test_rejects_wrong_q_dtype(small):
    cache, table, seqlens, plan, q = small
    with pytest.raises(TypeError, match=r"q: expected dtype bfloat16, got float32"):
        plan.run(q.float(), cache.layer(0), table, seqlens)


def test_rejects_wrong_head_dim(small):
    cache, table, seqlens, plan, q = small
    with pytest.raises(ValueError, match=r"q: plan was built for .*576.*got \[2, 1, 4, 512\]"):
        plan.run(q[..., :512].contiguous(), cache.layer(0), table, seqlens)


def test_rejects_plan_reuse_with_other_batch_or_heads(small, device):
    cache, table, seqlens, plan, _ = small
    with pytest.raises(ValueError, match=r"q: plan was built for"):
        plan.run(_q(2, 1, 8, device, 2), cache.layer(0), table, seqlens)
    with pytest.raises(ValueError, match=r"block_table: expected 2 rows"):
        plan.run(_q(2, 1, 4, device, 2), cache.layer(0), table[:1], seqlens)


def test_rejects_other_page_size_or_format(small, device):
    cache, table, seqlens, plan, q = small
    other, _, _ = paged_cache("fp8", [20], 32, device=device)
    with pytest.raises(ValueError, match=r"kv_cache: plan has page_size 16, cache pages hold 32"):
        plan.run(q, other.layer(0), table, seqlens)
    ds, _, _ = paged_cache("fp8_ds_mla", [20], 16, device=device)
    with pytest.raises(ValueError, match=r"kv_cache: expected uint8 \[num_pages, page_size, 576\]"):
        plan.run(q, ds.layer(0), table, seqlens)


def test_rejects_lengths_beyond_block_table(small):
    cache, table, seqlens, plan, q = small
    too_long = torch.tensor([20, table.shape[1] * 16 + 1], dtype=torch.int32, device=q.device)
    with pytest.raises(ValueError, match=r"cache_seqlens: expected lengths in \[0, 48\]"):
        plan.run(q, cache.layer(0), table, too_long)


@pytest.mark.parametrize("value", [0.0, -0.03, float("nan"), float("inf")])
def test_rejects_a_bad_fp8_scale_on_every_path(small, value):
    """A zero, negative or non-finite fp8 scale is refused where the plan validates (before,
    it decoded garbage silently); so are the baselines' scales of the wrong dtype."""
    cache, table, seqlens, plan, q = small
    bad = torch.tensor([value], device=q.device)
    with pytest.raises(ValueError, match=r"fp8_scale: expected a finite value > 0, got"):
        plan.run(q, cache.layer(0), table, seqlens, fp8_scale=bad)
    for backend in ("fp8mla", "full_cast", "gather_cast"):
        with pytest.raises(ValueError, match=r"fp8_scale: expected a finite value > 0, got"):
            dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8", fp8_scale=bad,
                         backend=backend)
    with pytest.raises(TypeError, match=r"fp8_scale: expected dtype float32, got float64"):
        dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8", backend="full_cast",
                     fp8_scale=torch.tensor([0.03], dtype=torch.float64, device=q.device))


def test_rejects_strided_lengths_or_block_table(small):
    """The kernels read cache_seqlens and block-table rows with unit stride: a strided view
    (every other element of a larger tensor) is refused, not misread."""
    cache, table, seqlens, plan, q = small
    spaced = torch.zeros(4, dtype=torch.int32, device=q.device)
    spaced[::2] = seqlens
    with pytest.raises(ValueError, match=r"cache_seqlens: expected a contiguous last dimension"):
        plan.run(q, cache.layer(0), table, spaced[::2])
    with pytest.raises(ValueError, match=r"cache_seqlens: expected a contiguous last dimension"):
        dense_decode(q, cache.layer(0), table, spaced[::2], kv_format="fp8",
                     fp8_scale=cache.scale(0))
    wide = torch.zeros(table.shape[0], 2 * table.shape[1], dtype=torch.int32, device=q.device)
    wide[:, ::2] = table
    with pytest.raises(ValueError, match=r"block_table: expected a contiguous last dimension"):
        plan.run(q, cache.layer(0), wide[:, ::2], seqlens)


def test_rejects_strided_q_and_a_misaligned_pool_on_every_backend(small):
    """The baselines launch the decode kernel without a plan's checks: q with a strided last
    dimension is refused up front (it was read as contiguous), as is a pool whose start is not
    4-byte aligned (its rows are read as 32-bit words) — each error naming the argument."""
    cache, table, seqlens, _, q = small
    wide = torch.zeros(*q.shape[:-1], 2 * q.shape[-1], dtype=q.dtype, device=q.device)
    wide[..., ::2] = q
    pool = cache.layer(0)
    buf = torch.zeros(pool.numel() + 2, dtype=torch.uint8, device=q.device)
    buf[2:].copy_(pool.reshape(-1))
    shifted = buf[2:].view(pool.shape)
    for backend in ("fp8mla", "full_cast", "gather_cast"):
        call = functools.partial(dense_decode, block_table=table, cache_seqlens=seqlens,
                                 kv_format="fp8", fp8_scale=cache.scale(0), backend=backend)
        with pytest.raises(ValueError, match=r"q: expected a contiguous last dimension"):
            call(wide[..., ::2], pool)
        with pytest.raises(ValueError, match=r"kv_cache: expected a start 4-byte aligned"):
            call(q, shifted)
    # bf16 rows are read as 16-bit values: a pool 2 bytes into a buffer serves as it is
    cache16, table16, seqlens16 = paged_cache("bf16", [20, 9], 16, device=q.device)
    pool16 = cache16.layer(0)
    buf = torch.zeros(pool16.numel() + 2, dtype=torch.uint8, device=q.device)
    buf[2:].copy_(pool16.reshape(-1))
    out = dense_decode(q, buf[2:].view(pool16.shape), table16, seqlens16, kv_format="bf16")
    want = dense_decode(q, pool16, table16, seqlens16, kv_format="bf16")
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


def test_fast_path_reads_no_further_than_the_block_table(device):
    """check=False trusts the lengths but never reads past a block-table row: a length beyond
    the row's pages attends to those pages only (here every entry is a real page, so reading
    on would take the next request's)."""
    cache, table, _ = paged_cache("fp8", [48, 48], 16, device=device)
    table = table[:, :3].contiguous()  # 3 real pages per row, no padding column
    plan = DecodePlan(batch=2, num_heads=4, kv_format="fp8", page_size=16, max_seqlen=48,
                      device=device)
    q = _q(2, 1, 4, device, 3)
    full = torch.tensor([48, 48], dtype=torch.int32, device=device)
    want, want_lse = (t.clone() for t in plan.run(q, cache.layer(0), table, full))
    past = torch.tensor([48 + 30, 48 + 100], dtype=torch.int32, device=device)
    out, lse = plan.run(q, cache.layer(0), table, past, check=False)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("fmt,page_size,heads", [("fp8", 64, 4), ("fp8_ds_mla", 64, 8),
                                                  ("bf16", 16, 3), ("fp8_ds_mla", 16, 32)])
def test_fast_path_reads_pages_outside_the_pool_as_its_last(device, fmt, page_size, heads):
    """check=False never reads outside the pool: a block-table entry past it, negative, or so
    large that page · page_size overflows int32 reads the pool's last page — in gathered tiles
    and whole (TMA) tiles alike — so the result is attention over that table. (SM90's Gluon
    kernels read such a page through TMA copies bounded by the pool's descriptor — zeros — and
    gathers masked to the pool: not this test's rule.)"""
    lens = [4 * page_size, 3 * page_size]
    cache, table, seqlens = paged_cache(fmt, lens, page_size, extra_pages=0, device=device,
                                        seed=5)
    bad = table.clone()
    bad[0, 1], bad[0, 3], bad[1, 0] = cache.num_pages, -3, 1 << 30
    q = _q(2, 1, heads, device, 6)
    plan = DecodePlan(batch=2, num_heads=heads, kv_format=fmt, page_size=page_size,
                      cache_seqlens=seqlens, softmax_scale=0.06, device=device)
    if plan.kernel != "triton":
        pytest.skip(f"served by SM90's {plan.kernel} kernel")
    out, lse = plan.run(q, cache.layer(0), bad, seqlens, fp8_scale=cache.scale(0), check=False)
    last = bad.clone()
    last[0, 1] = last[0, 3] = last[1, 0] = cache.num_pages - 1  # every page full: no NaN
    _check(cache, last, seqlens, q, out, lse, 0.06, folded=heads <= 16)


def test_rejects_block_table_entry_outside_pool(small):
    cache, table, seqlens, plan, q = small
    bad = table.clone()
    bad[1, 0] = cache.num_pages
    with pytest.raises(ValueError, match=r"block_table: a page within cache_seqlens points outside"):
        plan.run(q, cache.layer(0), bad, seqlens)


def test_rejects_bad_plan_arguments(device):
    with pytest.raises(ValueError, match=r"num_heads: expected an int in \[1, 128\], got 129"):
        DecodePlan(batch=1, num_heads=129, kv_format="fp8", page_size=16, max_seqlen=1,
                   device=device)
    with pytest.raises(ValueError, match=r"page_size: expected a power of two"):
        DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=48, max_seqlen=1,
                   device=device)
    with pytest.raises(ValueError, match=r"kv_format: expected one of bf16, fp8, fp8_ds_mla"):
        DecodePlan(batch=1, num_heads=8, kv_format="int4", page_size=16, max_seqlen=1,
                   device=device)
    with pytest.raises(ValueError, match=r"s_q: expected an int in \[1, 4\], got 5"):
        DecodePlan(batch=1, num_heads=8, s_q=5, kv_format="fp8", page_size=16, max_seqlen=1,
                   device=device)
    for scale in ("0.1", True, [0.1]):  # (numpy and 0-d torch scalars are accepted)
        with pytest.raises(TypeError, match=r"softmax_scale: expected a float, got"):
            DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1,
                       softmax_scale=scale, device=device)
    for scale in (float("nan"), 0.0, -1.0):
        with pytest.raises(ValueError, match=r"softmax_scale: expected a finite float > 0"):
            DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1,
                       softmax_scale=scale, device=device)
    plan = DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1,
                      softmax_scale=torch.tensor(0.125), device=device)
    assert plan.softmax_scale == 0.125
    with pytest.raises(TypeError, match=r"batch_invariant: expected a bool, got int"):
        DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1,
                   batch_invariant=1, device=device)
    with pytest.raises(ValueError, match=r"num_splits: expected None or 1 with batch_invariant "
                                         r"\(one split a request\), got 2"):
        DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=1,
                   batch_invariant=True, num_splits=2, device=device)
    with pytest.raises(ValueError, match=r"cache_seqlens: expected None with batch_invariant "
                                         r"\(the kernel may follow the length bound: pass "
                                         r"max_seqlen"):
        DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=16, batch_invariant=True,
                   cache_seqlens=torch.ones(1, dtype=torch.int32, device=device), device=device)
    plan = DecodePlan(batch=3, num_heads=8, kv_format="fp8", page_size=16, max_seqlen=10**5,
                      batch_invariant=True, device=device)
    assert plan.num_splits == 1 and plan.batch_invariant


@pytest.mark.parametrize("field,value,error,message", [
    ("block_n", 48, ValueError, r"DecodeConfig.block_n: expected a power of two in \[16, 128\], "
                                r"got 48"),
    ("num_warps", 3, ValueError, r"DecodeConfig.num_warps: .* got 3"),
    ("tma_stages", 0, ValueError, r"DecodeConfig.tma_stages: expected an int in \[1, 8\]"),
    ("tma", 1, TypeError, r"DecodeConfig.tma: expected a bool, got int"),
    ("maxnreg", 170, ValueError, r"DecodeConfig.maxnreg: expected None or a multiple of 8 in "
                                 r"\[24, 248\], got 170"),
    ("maxnreg", 256, ValueError, r"DecodeConfig.maxnreg: .* got 256"),
    ("lookahead", 3, ValueError, r"DecodeConfig.lookahead: expected 1 or 2, got 3"),
    ("late_sum", "yes", TypeError, r"DecodeConfig.late_sum: expected a bool, got str"),
])
def test_rejects_bad_decode_config(field, value, error, message):
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    with pytest.raises(error, match=message):
        replace(decode_config(90, "fp8", 8, 1), **{field: value})


def test_unknown_backend_lists_valid_ones(small):
    cache, table, seqlens, _, q = small
    with pytest.raises(ValueError, match=r"backend: expected fp8mla or one of full_cast"):
        dense_decode(q, cache.layer(0), table, seqlens, kv_format="fp8", backend="flashinfer")


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("words_2d", [False, True])
# pipeline depth exists only in compiled code: the interpreter would run stages 3 as 2
@pytest.mark.parametrize("stages", [2, 3] if torch.cuda.is_available() else [2])
def test_tile_load_variants_agree(device, fmt, words_2d, stages):
    from fp8mla.runtime import DecodeConfig

    cache, table, seqlens = paged_cache(fmt, [100, 5, 0], 16, device=device, seed=11)
    q = _q(3, 1, 8, device, 12)
    plan = DecodePlan(batch=3, num_heads=8, kv_format=fmt, page_size=16, cache_seqlens=seqlens,
                      device=device, num_splits=7,
                      config=DecodeConfig(block_n=32, heads_per_block=16, num_warps=4,
                                          num_stages=stages, words_2d=words_2d))
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5)


# (format, heads, page_size, lens, num_splits). The launcher's own TMA plans (fp8 and fp8_ds_mla
# at 16 and 64 rows; 32-row FP8 programs are gathered) also run in test_decode_matches_reference's
# page-64 cases (the interpreter stands for SM90); these add two tiles per page and the paths
# it does not pick.
TMA_CASES = [
    ("fp8", 8, 128, [300, 127, 0], 3),  # two tiles per page, an empty request
    ("fp8_ds_mla", 8, 64, [64, 1, 0, 200], 3),  # scales folded (16 rows per program)
    ("bf16", 8, 64, [64, 1, 0, 200], 3),
]


@pytest.mark.parametrize("fmt,heads,page_size,lens,splits", TMA_CASES)
def test_tma_tiles_match_reference(device, fmt, heads, page_size, lens, splits):
    """Pages holding whole tiles are copied a tile at a time by the tensor memory accelerator
    (SM90+; the interpreter runs the same descriptors): whole tiles, the partial last tile of a
    split (gathered, masked: the poisoned rows after it are never read), empty splits and a
    zero-length request. (Every other test here runs the gathered path.)"""
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    policy = "fp32" if fmt == "fp8_ds_mla" else None
    cache, table, seqlens = paged_cache(fmt, lens, page_size, policy=policy, device=device,
                                        seed=41)
    q = _q(len(lens), 2, heads, device, 42)
    kw = dict(batch=len(lens), num_heads=heads, s_q=2, kv_format=fmt, page_size=page_size,
              cache_seqlens=seqlens, device=device, num_splits=splits)
    # forced on: the launcher picks TMA only where it measured faster (runtime._tma_pays)
    plan = DecodePlan(**kw, config=replace(decode_config(90, fmt, heads, 2), tma=True))
    assert plan.tma
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5, policy, folded=heads <= 8)


def test_tma_descriptors_follow_the_pool(device):
    """A plan keeps its TMA descriptors for the pool it last ran on: a run on another pool
    (same shape, other contents and address) reads that pool."""
    lens = [130, 64]
    first = paged_cache("fp8", lens, 64, device=device, seed=51)
    second = paged_cache("fp8", lens, 64, device=device, seed=52)
    q = _q(2, 1, 8, device, 53)
    plan = DecodePlan(batch=2, num_heads=8, kv_format="fp8", page_size=64,
                      cache_seqlens=first[2], device=device)
    for cache, table, seqlens in (first, second):
        out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
        assert torch.isfinite(out).all()
        _check(cache, table, seqlens, q, out, lse, 576 ** -0.5)


def test_tma_where_it_pays_and_tiles_lie_in_pages(device):
    from fp8mla.runtime import decode_config

    kw = dict(batch=1, max_seqlen=64, device=device)
    assert not DecodePlan(kv_format="fp8", num_heads=8, page_size=16, **kw).tma  # spans pages
    on = DecodePlan(kv_format="fp8", num_heads=8, page_size=64, **kw)
    assert on.tma == (on.target.cc >= 90)
    assert [decode_config(cc, "fp8", 8, 1).tma for cc in (80, 89, 90, 100, 120)] == [
        False, False, True, True, True]
    # measured slower where the kernel then spills: folded fp8_ds_mla scales, bf16 at 16 rows
    assert not decode_config(90, "fp8_ds_mla", 8, 1).tma
    assert decode_config(90, "fp8_ds_mla", 128, 1).tma
    assert not decode_config(90, "bf16", 8, 1).tma
    assert decode_config(90, "bf16", 128, 1).tma  # 64 rows: one program an SM either way


def test_gathered_stages_where_measured():
    """3 stages (the next tile's slots carried) for SM90's dense and 64-row sparse programs
    (bar dense bf16 at 64 rows: 64-token tiles, 2 stages); 2 for 16-row sparse programs
    (measured slower carried) and on targets not measured; entries two tiles ahead only for
    bf16 at 16 rows (measured faster there, slower elsewhere)."""
    from fp8mla.runtime import decode_config, slots_ahead

    assert {decode_config(90, fmt, h, 1).num_stages for fmt in ("fp8", "fp8_ds_mla", "bf16")
            for h in (1, 8, 64, 128) if fmt != "bf16" or h < 64} == {3}
    # bf16 at 64 rows: 64-token tiles, by TMA or gathered at 2 stages (3 would not fit)
    assert {(c.block_n, c.num_stages, c.tma, c.tma_stages) for c in (
        decode_config(90, "bf16", h, s_q) for h, s_q in ((64, 1), (128, 1), (32, 2), (128, 2)))
    } == {(64, 2, True, 2)}
    assert decode_config(90, "bf16", 128, 1, sparse=True).block_n == 32
    assert decode_config(90, "fp8_ds_mla", 64, 1, sparse=True).num_stages == 3
    assert decode_config(90, "fp8_ds_mla", 8, 1, sparse=True).num_stages == 2
    assert {decode_config(cc, "fp8", h, 1).num_stages for cc in (80, 89, 100, 120)
            for h in (8, 128)} == {2}
    # slots carried from 3 stages on, never in a TMA plan (its gathered loop is one tile)
    assert [slots_ahead(st, tma) for st, tma in ((3, False), (2, False), (3, True))] == [1, 0, 0]
    assert [slots_ahead(st, False, 2) for st in (3, 2)] == [2, 0]
    assert [decode_config(90, "bf16", h, s_q).lookahead  # 16 rows = pow2(s_q) · heads
            for h, s_q in ((8, 1), (16, 1), (8, 2), (16, 2), (64, 1))] == [2, 2, 2, 1, 1]
    assert {decode_config(90, fmt, h, 1, sparse=sp).lookahead for fmt in ("fp8", "fp8_ds_mla")
            for h in (8, 128) for sp in (False, True)} | {
        decode_config(90, "bf16", 8, 1, sparse=True).lookahead} | {
        decode_config(cc, "bf16", 8, 1).lookahead for cc in (80, 89, 100, 120)} == {1}


def test_wide_tiles_where_measured():
    """32-row dense FP8 programs on SM90 take 128 gathered tokens × 8 warps (measured faster
    than 32 tokens × 4 warps by TMA); 16- and 64-row programs, bf16, sparse and other targets
    keep their tiles."""
    from fp8mla.runtime import decode_config

    for fmt in ("fp8", "fp8_ds_mla"):
        for heads, s_q in ((16, 2), (32, 1), (20, 1), (5, 4), (8, 3), (12, 2)):  # 32 rows
            c = decode_config(90, fmt, heads, s_q)
            assert (c.block_n, c.num_warps, c.tma) == (128, 8, False), (fmt, heads, s_q, c)
            # as measured: 3 stages (slots carried one tile ahead), lazy rescale, late sums
            assert (c.num_stages, c.lookahead, c.lazy_rescale, c.late_sum) == (3, 1, True, True)
        assert decode_config(90, fmt, 16, 1).block_n == 64  # 16 rows
        assert decode_config(90, fmt, 64, 1).block_n == 64  # 64 rows
        assert decode_config(90, fmt, 32, 1, sparse=True).block_n == 32
        assert {decode_config(cc, fmt, 32, 1).block_n for cc in (80, 89, 100, 120)} == {32}
    assert decode_config(90, "bf16", 32, 1).block_n == 32


def test_lazy_softmax_where_measured():
    """Lazy rescale and late row sums together, for dense FP8 at ≤ 32 rows on SM90 only
    (measured faster there; bf16 ±1%, sparse 16-row programs slower, 64 rows spill)."""
    from fp8mla.runtime import decode_config

    def on(cc, fmt, heads, s_q=1, sparse=False):
        c = decode_config(cc, fmt, heads, s_q, sparse=sparse)
        assert c.lazy_rescale == c.late_sum
        return c.lazy_rescale

    assert all(on(90, fmt, h, s_q) for fmt in ("fp8", "fp8_ds_mla")
               for h, s_q in ((1, 1), (8, 1), (16, 1), (16, 2), (8, 4)))
    assert not any([on(90, "bf16", 16), on(90, "fp8", 64), on(90, "fp8_ds_mla", 128),
                    on(90, "fp8", 32, 2), on(90, "fp8_ds_mla", 8, sparse=True)]
                   + [on(cc, "fp8", 8) for cc in (80, 89, 100, 120)])


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_slots_two_tiles_ahead(device, fmt):
    """DecodeConfig.lookahead = 2 (block-table entries loaded two tiles ahead; the launcher's
    choice for bf16 at 16 rows, which this file's bf16 cases run) on the FP8 formats: many
    tiles, a request ending mid-tile, one shorter than a tile and an empty one, against the
    reference with the pool's unowned pages NaN."""
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    cache, table, seqlens = paged_cache(fmt, [230, 5, 0, 97], 16, device=device, seed=51)
    q = _q(4, 1, 8, device, 52)
    cfg = replace(decode_config(90, fmt, 8, 1), block_n=32, tma=False, lookahead=2)
    plan = DecodePlan(batch=4, num_heads=8, kv_format=fmt, page_size=16, cache_seqlens=seqlens,
                      device=device, num_splits=2, config=cfg)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5)


@pytest.mark.parametrize("fold", [False, True])
def test_ds_mla_scale_paths_agree(device, fold):
    """Both ways of applying fp8_ds_mla scales at ≤ 16 rows per program (folded into the
    float32 scores and P, or multiplied into the fp16 tile) match the reference, fp32-policy
    scales included."""
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    cache, table, seqlens = paged_cache("fp8_ds_mla", [130, 7], 16, policy="fp32",
                                        device=device, seed=31)
    q = _q(2, 1, 8, device, 32)
    cfg = replace(decode_config(90, "fp8_ds_mla", 8, 1), block_n=32, fold_scales=fold)
    plan = DecodePlan(batch=2, num_heads=8, kv_format="fp8_ds_mla", page_size=16,
                      cache_seqlens=seqlens, device=device, num_splits=2, config=cfg)
    out, lse = plan.run(q, cache.layer(0), table, seqlens)
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5, "fp32", folded=fold)


def test_non_causal_mtp_sees_every_token(device):
    cache, table, seqlens = paged_cache("fp8", [50, 9], 16, device=device, seed=21)
    q = _q(2, 3, 4, device, 22)
    plan = DecodePlan(batch=2, num_heads=4, s_q=3, kv_format="fp8", page_size=16,
                      cache_seqlens=seqlens, device=device, causal=False)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    for i in range(3):  # each query alone, as s_q = 1, sees the whole context
        ro, rl = reference.dense_mla_decode(q[:, i:i + 1], cache.dequantize(0), table, seqlens,
                                            576 ** -0.5)
        assert_close(out[:, i:i + 1], ro, name=f"query {i}")
        assert_close(lse[:, i:i + 1], rl, atol=1e-3, rtol=1e-3, name=f"lse {i}")



@pytest.mark.parametrize("splits", [1, 3])
def test_writes_given_outputs_in_any_layout(device, splits):
    """out / lse given: written in place (lse through a transposed view, FlashMLA's
    [batch, heads, s_q]); empty_lse=+inf marks the request with nothing to attend."""
    cache, table, seqlens = paged_cache("fp8_ds_mla", [70, 0, 9], 16, device=device, seed=41)
    q = _q(3, 2, 4, device, 42)
    plan = DecodePlan(batch=3, num_heads=4, s_q=2, kv_format="fp8_ds_mla", page_size=16,
                      cache_seqlens=seqlens, device=device, num_splits=splits)
    out = torch.full((3, 2, 4, 512), float("nan"), dtype=torch.bfloat16, device=device)
    lse_bhs = torch.full((3, 4, 2), float("nan"), device=device)
    o, lse = plan.run(q, cache.layer(0), table, seqlens, out=out, lse=lse_bhs.transpose(1, 2),
                      empty_lse=float("inf"))
    assert o.data_ptr() == out.data_ptr() and lse.data_ptr() == lse_bhs.data_ptr()
    ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse_bhs.transpose(1, 2), rl.masked_fill(rl == float("-inf"), float("inf")),
                 atol=1e-3, rtol=1e-3, name="lse")
    assert torch.isinf(lse_bhs[1]).all() and (lse_bhs[1] > 0).all()


def test_rejects_bad_given_outputs(small, device):
    cache, table, seqlens, plan, q = small
    with pytest.raises(ValueError, match=r"lse: expected shape"):
        plan.run(q, cache.layer(0), table, seqlens,
                 lse=torch.empty(9, dtype=torch.float32, device=device))
    with pytest.raises(TypeError, match=r"out: expected dtype"):
        plan.run(q, cache.layer(0), table, seqlens,
                 out=torch.empty(*q.shape[:3], 512, dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match=r"empty_lse: expected -inf or \+inf"):
        plan.run(q, cache.layer(0), table, seqlens, empty_lse=0.0)


def test_rejects_a_bad_debug_timeline(small, device):
    """`DecodePlan.timeline` (debug stamps) is checked before a launch writes into it: int64
    [batch × num_splits, 12] on the plan's device; a good one leaves the outputs as they were
    (the kernels that do not stamp ignore it)."""
    cache, table, seqlens, plan, q = small
    out, lse = (t.clone() for t in plan.run(q, cache.layer(0), table, seqlens))
    rows = plan.batch * plan.num_splits
    for bad, error in ((torch.zeros(rows, 12, dtype=torch.int32, device=device), TypeError),
                       (torch.zeros(rows + 1, 12, dtype=torch.int64, device=device), ValueError)):
        plan.timeline = bad
        with pytest.raises(error, match=r"timeline: expected"):
            plan.run(q, cache.layer(0), table, seqlens)
    plan.timeline = torch.zeros(rows, 12, dtype=torch.int64, device=device)
    o2, l2 = plan.run(q, cache.layer(0), table, seqlens)
    assert torch.equal(o2, out) and torch.equal(l2, lse)


@pytest.mark.parametrize("fmt,policy,lazy,late", [
    ("fp8", None, True, True), ("fp8_ds_mla", "fp32", True, True),  # the launcher's, folded
    ("fp8", None, True, False), ("fp8", None, False, True), ("bf16", None, False, False)])
def test_online_softmax_steps_past_and_within_the_slack(device, fmt, policy, lazy, late):
    """DecodeConfig.lazy_rescale / late_sum (kernels/decode.py `_softmax_tile`) where the
    scores step up mid-request: by ~5 powers of two (under the slack: P is taken against the
    stale max, up to 2⁵), by ~20 (past it: the accumulators are rescaled mid-request), then
    back down — output, lse and max_logits against the reference, one split walking 32-token
    tiles, with a short request and a poisoned pool."""
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    cache, table, seqlens = paged_cache(fmt, [160, 45], 16, policy=policy, device=device,
                                        seed=61)
    g = torch.Generator().manual_seed(62)
    pos = torch.arange(160, device=device)
    slots = table[0, pos // 16].long() * 16 + pos % 16
    step = torch.zeros(160)
    step[40:90], step[90:130] = 1.5, 6.0  # rope dim 0: 0.06 · 40 · step · log2 e ≈ 3.5 · step
    rope = torch.randn(160, 64, generator=g)
    rope[:, 0] = step
    cache.store(0, torch.randn(160, 512, generator=g).bfloat16().to(device),
                rope.bfloat16().to(device), slots)
    q = _q(2, 1, 8, device, 63)
    q[..., 512] = 40.0
    cfg = replace(decode_config(90, fmt, 8, 1), block_n=32, tma=False, lazy_rescale=lazy,
                  late_sum=late)
    plan = DecodePlan(batch=2, num_heads=8, kv_format=fmt, page_size=16, cache_seqlens=seqlens,
                      softmax_scale=0.06, device=device, num_splits=1, config=cfg)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    _check(cache, table, seqlens, q, out, lse, 0.06, policy)
    kv = cache.dequantize(0)
    for b, n in enumerate(seqlens.tolist()):
        p = torch.arange(n, device=device)
        rows = kv[table[b, p // 16].long(), p % 16].float()
        want = (q[b, 0].float() @ rows.T * 0.06).amax(-1)
        assert_close(plan.max_logits[b, 0], want, atol=1e-3, rtol=1e-3, name="max_logits")


@pytest.mark.parametrize("lazy", [True, False])
def test_folded_scales_of_large_values_under_the_slack(device, lazy):
    """fp8_ds_mla folded at 16 rows with scale tiles of large values (|x| = 600: pow2 scale 2)
    and a score step just under the lazy slack (P reaches ~2⁷ against the stale max): P ·
    scale must stay finite in fp16 — the software conversion's 2⁸ factor (interpreter, SM80)
    once rode on that product and overflowed it (found in review, session 10)."""
    from dataclasses import replace

    from fp8mla.runtime import decode_config

    cache, table, seqlens = paged_cache("fp8_ds_mla", [128], 64, policy="pow2",
                                        device=device, seed=71)
    pos = torch.arange(128, device=device)
    slots = table[0, pos // 64].long() * 64 + pos % 64
    lat = torch.zeros(128, 512)
    lat[:, 1] = 600.0  # the same 128-dim scale tile as dim 0
    lat[100, 0] = 5.0  # a second-tile score 5 · log2 e ≈ 7.2 powers of two above the first's
    cache.store(0, lat.bfloat16().to(device), torch.zeros(128, 64).bfloat16().to(device), slots)
    q = torch.zeros(1, 1, 1, 576)
    q[..., 0] = 1.0
    q = q.bfloat16().to(device)
    cfg = replace(decode_config(90, "fp8_ds_mla", 1, 1), tma=False, lazy_rescale=lazy,
                  late_sum=lazy)
    plan = DecodePlan(batch=1, num_heads=1, kv_format="fp8_ds_mla", page_size=64,
                      cache_seqlens=seqlens, softmax_scale=1.0, device=device, num_splits=1,
                      config=cfg)
    assert plan.folds_scales
    out, lse = plan.run(q, cache.layer(0), table, seqlens)
    _check(cache, table, seqlens, q, out, lse, 1.0, "pow2")


@pytest.mark.parametrize("block_d,block_s", [(512, 2), (32, 4)])
def test_combine_merges_splits_online(device, block_d, block_s):
    """`_combine_splits_kernel` against a torch LSE merge: 7 splits read a few at a time, a row
    whose first steps are all empty splits (lse −inf), one with a lone late split, and an
    all-empty row (zeros, the empty lse, max −inf)."""
    from fp8mla.kernels.decode import _combine_splits_kernel

    g = torch.Generator().manual_seed(81)
    batch, splits, heads = 2, 7, 3
    part = torch.randn(batch, splits, 1, heads, 512, generator=g)
    lse = torch.randn(batch, splits, 1, heads, generator=g) * 3
    mx = lse + torch.rand(batch, splits, 1, heads, generator=g)
    lse[0, :4, 0, 0] = float("-inf")  # leading empty splits
    lse[0, :6, 0, 1] = float("-inf")  # only the last split holds tokens
    lse[1, :, 0, 2] = float("-inf")  # nothing at all
    mx[lse == float("-inf")] = float("-inf")
    part[lse == float("-inf")] = 0.0  # as the decode kernel writes empty splits
    out = torch.full((batch, 1, heads, 512), float("nan"), dtype=torch.bfloat16)
    lse_out = torch.full((batch, 1, heads), float("nan"))
    max_out = torch.full((batch, 1, heads), float("nan"))
    args = [t.to(device) for t in (part, lse, mx, out, lse_out, max_out)]
    _combine_splits_kernel[(batch, 1, heads * 512 // block_d)](
        *args, args[3].stride(0), args[3].stride(1), args[3].stride(2), args[4].stride(0),
        args[4].stride(1), args[4].stride(2), -7.0, splits, heads, S_Q=1, DIM=512,
        BLOCK_D=block_d, BLOCK_S=block_s)
    total = torch.logsumexp(lse, dim=1)  # [batch, 1, heads]
    w = torch.exp(lse - total[:, None]).nan_to_num(0.0)
    want = (part * w[..., None]).sum(1)
    empty = total == float("-inf")
    assert_close(args[3].cpu(), want.masked_fill(empty[..., None], 0.0), name="out")
    assert_close(args[4].cpu(), total.masked_fill(empty, -7.0), name="lse")
    assert torch.equal(args[5].cpu(), mx.amax(1))


@pytest.mark.parametrize("fmt,policy", FORMATS)
@pytest.mark.parametrize("splits", [1, 3])
def test_blind_query_rows(device, fmt, policy, splits):
    """Causal MTP over requests shorter than s_q: a query that sees no token gets zeros, lse
    ``empty_lse`` (−inf, or +inf where asked) and max_logits −inf, with one split (the kernel
    writes them) or three (the combine); every other row matches the reference."""
    lens, s_q, heads = [1, 70, 2, 3], 3, 3
    cache, table, seqlens = paged_cache(fmt, lens, 16, policy=policy, device=device, seed=29)
    q = _q(len(lens), s_q, heads, device, 30)
    plan = DecodePlan(batch=len(lens), num_heads=heads, s_q=s_q, kv_format=cache.fmt,
                      page_size=16, cache_seqlens=seqlens, device=device, num_splits=splits)
    run = functools.partial(plan.run, q, cache.layer(0), table, seqlens,
                            fp8_scale=cache.scale(0))
    out, lse = run()
    _check(cache, table, seqlens, q, out, lse, 576 ** -0.5, policy)
    blind = assert_blind_rows(plan, run, lens, out, lse)
    assert blind.sum() == 3 and torch.all(plan.max_logits[~blind].isfinite())


def test_every_backend_takes_the_same_problems(small):
    """The baselines (the reference included) refuse what the native plan refuses: a bad
    softmax_scale, s_q past 4, heads past 128, a pool on another device; and a plan's
    negative lengths are named as cache_seqlens."""
    cache, table, seqlens, plan, q = small
    for backend in ("reference", "gather_cast", "full_cast"):
        def call(backend=backend, **kw):
            args = dict(q=q, kv_cache=cache.layer(0), softmax_scale=None)
            args.update(kw)
            return dense_decode(args["q"], args["kv_cache"], table, seqlens,
                                kv_format=cache.fmt, softmax_scale=args["softmax_scale"],
                                backend=backend)

        with pytest.raises(ValueError, match="softmax_scale: expected a finite float > 0"):
            call(softmax_scale=float("nan"))
        with pytest.raises(ValueError, match=r"s_q \(q.shape\[1\]\): expected an int in \[1, 4\]"):
            call(q=q.expand(-1, 5, -1, -1).contiguous())
        with pytest.raises(ValueError, match=r"heads \(q.shape\[2\]\): expected an int in \[1, 128\]"):
            call(q=q[:, :, :1].expand(-1, -1, 129, -1).contiguous())
        with pytest.raises(ValueError, match="kv_cache: expected device .*, got meta"):
            call(kv_cache=cache.layer(0).to("meta"))
    with pytest.raises(ValueError, match="cache_seqlens: expected lengths to read .*got a meta"):
        DecodePlan(batch=2, num_heads=2, kv_format="fp8", page_size=16, device=q.device,
                   cache_seqlens=torch.zeros(2, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="cache_seqlens: expected lengths >= 0, got -5"):
        DecodePlan(batch=2, num_heads=2, kv_format="fp8", page_size=16, device=q.device,
                   cache_seqlens=torch.tensor([-5, -1], dtype=torch.int32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_a_cuda_plan_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="device: cuda asked for, but this torch finds no "
                                           "CUDA GPU"):
        DecodePlan(batch=1, num_heads=8, kv_format="fp8", page_size=64, max_seqlen=64)
