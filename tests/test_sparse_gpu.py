"""Sparse decode at full size (topk 2048) and under CUDA-graph capture (GPU only): both ways
the attention kernels read index lists — checked per entry (≤ 32 heads per program; the Gluon
SM90 kernels at ≤ 8 heads — ≤ 16 switched on — and at 64 heads and more) and compacted first
(the Triton kernel's 64-row programs)."""

import pytest
import torch

from fp8mla import reference
from fp8mla.sparse import SparsePlan
from fp8mla.testing import assert_close
from helpers import (
    assert_close_qk8,
    assert_timeline_in_order,
    extreme_q,
    sm90_gluon_only,
    sparse_lists,
    sparse_pool,
)

pytestmark = pytest.mark.gpu


def sparse_problem(fmt, queries, heads, topk, *, pages=512, page_size=64, policy=None,
                   device="cuda", seed=0):
    """A poisoned pool where only listed slots hold data; lists with −1 (~20%), duplicates and
    slots past the pool's end (skipped by the fast path)."""
    g = torch.Generator().manual_seed(seed)
    cache, live = sparse_pool(fmt, policy, pages, page_size, device, g)
    q = torch.randn(queries, heads, 576, generator=g).bfloat16().to(device)
    idx = _lists(live, queries, topk, cache.num_slots, g).to(device)
    return cache, live, q, idx


def _lists(live, queries, topk, num_slots, g):
    idx = sparse_lists(live, queries, topk, g)
    idx[0, 5] = num_slots + 7  # out of the pool: the fast path skips it
    return idx


def _reference(cache, q, idx, lengths):
    """The float32 reference over layer 0's dequantized rows (slots outside the pool skipped,
    as the fast path does): (out, lse, the rows float32 [slots, 576], the in-pool mask)."""
    ok = (idx >= 0) & (idx < cache.num_slots)
    kv = cache.dequantize(0).reshape(-1, 576)
    ro, rl = reference.sparse_mla(q, kv, torch.where(ok, idx, -1), 576 ** -0.5, lengths)
    return ro, rl, kv, ok


def _check(cache, q, idx, lengths, out, lse):
    ro, rl, _, _ = _reference(cache, q, idx, lengths)
    assert_close(out, ro, name="out")
    assert_close(lse, rl, atol=1e-3, rtol=1e-3, name="lse")


@pytest.mark.parametrize("fmt,policy", [("fp8_ds_mla", "pow2"), ("fp8_ds_mla", "fp32"),
                                        ("fp8", None), ("bf16", None)])
@pytest.mark.parametrize("heads", [128, 64, 8])
def test_full_size_matches_reference(fmt, policy, heads):
    cache, _, q, idx = sparse_problem(fmt, 5, heads, 2048, policy=policy, seed=heads)
    lengths = torch.tensor([2048, 1, 0, 1500, 2047], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=5, num_heads=heads, topk=2048, kv_format=cache.fmt,
                      device="cuda")
    assert plan.checks_indices == (plan.config.heads_per_block < 64)
    out, lse = plan.run(q, cache.layer(0), idx, lengths, fp8_scale=cache.scale(0), check=False)
    _check(cache, q, idx, lengths, out, lse)


@pytest.mark.parametrize("heads", [8, 16, 128])
def test_bf16_partials_sparse(heads, monkeypatch):
    """Split partials in bfloat16 (`PARTIALS_BF16_MIN_SPLITS` 1, `PARTIALS_BF16_EVERYWHERE`)
    through the sparse kernels' partial stores and the combine, three splits: 8 heads on the
    ≤ 8-head Gluon kernel (SM90), 16 on the Triton kernel (not the 64-head kernel this short
    batch would take, `SPARSE_SM90_SMALL_BATCH`), 128 on the 64-head Gluon kernel (SM90)."""
    import fp8mla.decode as decode_mod

    monkeypatch.setattr(decode_mod, "SPARSE_SM90_SMALL_BATCH", 0)
    monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", 1)
    monkeypatch.setattr(decode_mod, "PARTIALS_BF16_EVERYWHERE", True)
    cache, _, q, idx = sparse_problem("fp8_ds_mla", 5, heads, 2048, seed=heads + 7)
    lengths = torch.tensor([2048, 1, 0, 1500, 2047], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=5, num_heads=heads, topk=2048, kv_format=cache.fmt,
                      device="cuda", num_splits=3)
    assert plan.num_splits == 3 and plan.part_out.dtype == torch.bfloat16
    out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    _check(cache, q, idx, lengths, out, lse)


@pytest.mark.parametrize("heads", [8, 3])
@pytest.mark.parametrize("splits,min_splits", [(3, 1), (3, 1025), (1, 1)])
def test_sm90_row_stores_sparse(heads, splits, min_splits, monkeypatch):
    """The ≤ 8-head sparse kernel's (SM90) rows, its chunks' dims relabelled into order and
    stored 16 bytes a store (`decode_sm90_mma8._store_in_order`), to out (one split) or to
    partials in bf16 and float32; 3 heads leave rows of the program empty."""
    import fp8mla.decode as decode_mod

    monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", min_splits)
    cache, _, q, idx = sparse_problem("fp8_ds_mla", 5, heads, 2048, seed=heads + 11)
    lengths = torch.tensor([2048, 1, 0, 1500, 2047], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=5, num_heads=heads, topk=2048, kv_format=cache.fmt,
                      device="cuda", num_splits=splits)
    if torch.cuda.get_device_capability() == (9, 0):
        assert plan.kernel == "mma8"
    if splits > 1:
        want = decode_mod.partials_dtype(splits, plan.kernel, "fp8_ds_mla", plan.block_rows)
        assert plan.part_out.dtype == want  # (mma8, SM90: bf16 iff min_splits 1)
        if plan.kernel == "mma8":
            assert want == (torch.bfloat16 if min_splits == 1 else torch.float32)
    out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    _check(cache, q, idx, lengths, out, lse)


@pytest.mark.parametrize("heads,splits,in_order,bf16_partials", [
    (128, 1, True, False), (100, 3, True, True), (128, 3, True, False), (128, 1, False, False),
    (128, 3, False, False)])
def test_sm90_rows_in_order_sparse(heads, splits, in_order, bf16_partials, monkeypatch):
    """The 64-row Gluon sparse kernel (SM90)'s bf16 rows stored 8 dims a thread in dim order
    (`SM90_ROWS_IN_ORDER`) — out (one split) and its bf16 partials (the default in split
    plans) — float32 partials, and the accumulator's stores (the switch off) match the
    reference; 100 heads: a part-empty second head block."""
    import fp8mla.decode as decode_mod

    sm90_gluon_only("sparse")
    monkeypatch.setattr(decode_mod, "SM90_ROWS_IN_ORDER", in_order)
    if not bf16_partials:
        monkeypatch.setattr(decode_mod, "PARTIALS_BF16_MIN_SPLITS", 1025)
    cache, _, q, idx = sparse_problem("fp8_ds_mla", 5, heads, 2048, seed=heads + 13)
    lengths = torch.tensor([2048, 1, 0, 1500, 2047], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=5, num_heads=heads, topk=2048, kv_format=cache.fmt,
                      device="cuda", num_splits=splits)
    assert plan.kernel == "sm90"
    if splits > 1:
        assert plan.part_out.dtype == (torch.bfloat16 if bf16_partials else torch.float32)
    out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    _check(cache, q, idx, lengths, out, lse)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8"])
@pytest.mark.parametrize("heads", [100, 64, 24, 12])
@pytest.mark.parametrize("splits", [1, 3])
def test_sm90_gluon_sparse_kernel_direct_and_split(splits, heads, fmt, monkeypatch):
    """The Gluon sparse kernel (SM90, fp8_ds_mla or fp8 rows — `SM90_GATHER_FP8` —, 64-head
    programs) with one split — it writes out / lse / max_logits itself — and with three: 100
    heads (a half-empty second block), 64, 24 or 12 (one part-empty block; taken from 9 heads
    on here, whatever `SPARSE_SM90_MIN_HEADS` and `SPARSE_SM90_SMALL_BATCH` say), a query with
    no valid entry (lse +inf), −1
    and slots past the pool scattered through the lists (whole tiles of them too),
    topk_length shorter than the list; the kernel checks each entry itself (no compaction)."""
    import fp8mla.decode as decode_mod

    sm90_gluon_only("sparse")
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_MIN_HEADS", 9)
    cache, _, q, idx = sparse_problem(fmt, 4, heads, 700, seed=31)
    idx[2] = -1  # nothing to attend
    idx[0, 64:200] = -1  # whole tiles of skipped entries, then a valid one
    idx[0, 200:260:3] = cache.num_slots + 5  # past the pool: skipped, never read
    idx[3, ::7] = -1
    lengths = torch.tensor([700, 300, 700, 65], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=4, num_heads=heads, topk=700, kv_format=fmt,
                      device="cuda", num_splits=splits)
    assert plan.kernel == "sm90" and not plan.compacts and plan.num_splits == splits
    out = torch.full((4, heads, 512), float("nan"), device="cuda").bfloat16()
    lse = torch.full((4, heads), float("nan"), device="cuda")
    plan.run(q, cache.layer(0), idx, lengths, check=False, out=out, lse=lse,
             empty_lse=float("inf"), fp8_scale=cache.scale(0))
    ro, rl, _, _ = _reference(cache, q, idx, lengths)
    assert_close(out, ro, name="out")
    live = [0, 1, 3]
    assert_close(lse[live], rl[live], atol=1e-3, rtol=1e-3, name="lse")
    assert torch.all(lse[2] == float("inf")) and torch.all(out[2] == 0)


def _force(monkeypatch, kernel, stages=None, qk8=None):
    """Serve ≤ 16-head fp8_ds_mla plans by ``kernel``: "mma8" (the ≤ 8-row Gluon kernel,
    `SPARSE_SM90_MMA8`, with ``stages`` ring stages and, where ``qk8`` is given, its first
    product as FP8 wgmma or not: `SPARSE_SM90_MMA8_QK8`) or "triton" (9–16 heads: not the
    64-row gather kernel that serves short batches, `SPARSE_SM90_SMALL_BATCH`)."""
    import fp8mla.decode as decode_mod

    monkeypatch.setattr(decode_mod, "SPARSE_SM90_SMALL_BATCH", 0)
    if qk8 is not None:
        monkeypatch.setattr(decode_mod, "SPARSE_SM90_MMA8_QK8", qk8)
    monkeypatch.setattr(decode_mod, "SPARSE_SM90_MMA8", kernel == "mma8")
    if stages:
        monkeypatch.setattr(decode_mod, "SPARSE_SM90_MMA8_STAGES", stages)


def _served_by(plan, kernel):
    """Skip where the forced Gluon kernel cannot serve (not SM90, no Gluon, too many heads)."""
    served = {"mma8": plan.mma8, "triton": not plan.sm90}[kernel]
    if kernel != "triton" and not served:
        pytest.skip(f"the {kernel} Gluon kernel serves SM90 GPUs with a Triton that has Gluon"
                    f"{' and ≤ 8 heads' * (kernel == 'mma8')}")
    assert served and not plan.compacts


@pytest.mark.parametrize("heads", [16, 8, 5, 3])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kernel", ["mma8", "triton"])
def test_few_head_sparse_kernels_direct_and_split(kernel, splits, heads, monkeypatch):
    """≤ 16-head programs over fp8_ds_mla lists: the Gluon SM90 kernel (≤ 8 rows on mma.sync,
    `SPARSE_SM90_MMA8`, on an SM90 GPU) and the Triton kernel, with one split and three, a
    query with no valid entry (lse +inf), whole tiles of −1, slots past the pool, −1 every 7th
    entry, topk_length shorter than the list and not a multiple of a tile."""
    _force(monkeypatch, kernel)
    cache, _, q, idx = sparse_problem("fp8_ds_mla", 4, heads, 700, seed=37 + heads)
    idx[2] = -1
    idx[0, 64:330] = -1
    idx[0, 330:400:3] = cache.num_slots + 5
    idx[3, ::7] = -1
    lengths = torch.tensor([700, 300, 700, 129], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=4, num_heads=heads, topk=700, kv_format="fp8_ds_mla",
                      device="cuda", num_splits=splits)
    _served_by(plan, kernel)
    out = torch.full((4, heads, 512), float("nan"), device="cuda").bfloat16()
    lse = torch.full((4, heads), float("nan"), device="cuda")
    plan.run(q, cache.layer(0), idx, lengths, check=False, out=out, lse=lse,
             empty_lse=float("inf"))
    ro, rl, _, _ = _reference(cache, q, idx, lengths)
    assert_close(out, ro, name="out")
    live = [0, 1, 3]
    assert_close(lse[live], rl[live], atol=1e-3, rtol=1e-3, name="lse")
    assert torch.all(lse[2] == float("inf")) and torch.all(out[2] == 0)


@pytest.mark.parametrize("heads", [8, 3])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_sparse_mma8_entries_past_the_count_unread(splits, heads, monkeypatch):
    """The ≤ 8-row sparse kernel reads tile 0's entries and their rows' scales before the
    list's count has loaded, for the chunk a count of the list's width starts at
    (`_mla_sparse_mma8_kernel`): every entry past a count points at a poisoned slot (NaN
    latent, scales and rope), counts inside tile 0, short and full give starts that differ
    from that guess and ones that match — nothing past a count reaches the output."""
    _force(monkeypatch, "mma8")
    cache, live, q, idx = sparse_problem("fp8_ds_mla", 5, heads, 700, seed=53 + heads)
    listed = torch.zeros(cache.num_slots, dtype=torch.bool)
    listed[live] = True
    dead = torch.nonzero(~listed).flatten().to(torch.int32)  # never stored: poisoned
    lengths = [700, 300, 1, 0, 40]
    g = torch.Generator().manual_seed(heads)
    for b, n in enumerate(lengths):
        idx[b, n:] = dead[torch.randint(len(dead), (700 - n,), generator=g)].to(idx.device)
    lengths = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=5, num_heads=heads, topk=700, kv_format=cache.fmt,
                      device="cuda", num_splits=splits)
    _served_by(plan, "mma8")
    out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    assert not out.isnan().any()
    _check(cache, q, idx, lengths, out, lse)


@pytest.mark.parametrize("qk8", [False, True])
@pytest.mark.parametrize("policy", ["pow2", "fp32"])
@pytest.mark.parametrize("stages,heads", [(3, 8), (2, 8), (3, 1), (2, 7)])
def test_sparse_mma8_kernel_full_size(policy, stages, heads, qk8, monkeypatch):
    """The ≤ 8-row sparse kernel at topk 2048 over both scale policies (fp32 scales are not
    powers of two: P · scale in fp16 rounds), both ring depths and both first products
    (mma.sync over converted words; FP8 wgmma over the gathered bytes), the scheduler's split
    count, lengths around a tile, every unlisted slot NaN-poisoned."""
    _force(monkeypatch, "mma8", stages, qk8)
    cache, _, q, idx = sparse_problem("fp8_ds_mla", 5, heads, 2048, policy=policy,
                                      seed=11 + stages + heads)
    lengths = torch.tensor([2048, 1, 0, 1500, 65], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=5, num_heads=heads, topk=2048, kv_format=cache.fmt,
                      device="cuda")
    _served_by(plan, "mma8")
    out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    _check(cache, q, idx, lengths, out, lse)


@pytest.mark.parametrize("policy", ["pow2", "fp32"])
def test_sparse_mma8_fp8_scores_any_q_magnitude(policy, monkeypatch):
    """The ≤ 8-row sparse kernel's FP8 first product (q's latent split per row by a power of
    two into e4m3 halves, each chunk's sum scaled after) on `extreme_q`'s rows, within
    `assert_close_qk8`'s tolerance."""
    _force(monkeypatch, "mma8", qk8=False)  # the switch off: the plan asks for it
    cache, _, _, idx = sparse_problem("fp8_ds_mla", 3, 8, 2048, policy=policy, seed=19)
    q = extreme_q(3, 8, seed=19)
    lengths = torch.tensor([2048, 1800, 700], dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=3, num_heads=8, topk=2048, kv_format=cache.fmt,
                      device="cuda", fp8_scores=True)
    _served_by(plan, "mma8")
    assert plan.qk8
    out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    ro, rl, kv, ok = _reference(cache, q, idx, lengths)
    listed = ok & (torch.arange(2048, device="cuda")[None, :] < lengths[:, None])
    logit_max = torch.stack([(q[t].float() @ kv[idx[t][listed[t]].long()].T).abs().max(-1)[0]
                             for t in range(3)]) * 576 ** -0.5
    assert_close_qk8(out, lse, ro, rl, logit_max)


@pytest.mark.parametrize("heads,kernel", [(128, "triton"), (8, "triton"), (8, "mma8"),
                                          (8, "mma8-qk8")])
def test_cuda_graph_replays_with_new_lists_and_contents(heads, kernel, monkeypatch):
    """One capture, replays after the index lists, lengths, q and the listed rows changed
    (8 heads: on the Triton kernel and on the ≤ 8-row Gluon kernel, both first products)."""
    if kernel.startswith("mma8"):
        _force(monkeypatch, "mma8", qk8=kernel == "mma8-qk8")
        kernel = "mma8"
    cache, live, q, idx = sparse_problem("fp8_ds_mla", 4, heads, 2048, seed=5)
    lengths = torch.full((4,), 2048, dtype=torch.int32, device="cuda")
    plan = SparsePlan(num_queries=4, num_heads=heads, topk=2048, kv_format="fp8_ds_mla",
                      device="cuda")
    if kernel == "mma8":
        _served_by(plan, "mma8")
    plan.run(q, cache.layer(0), idx, lengths, check=False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = plan.run(q, cache.layer(0), idx, lengths, check=False)
    g = torch.Generator().manual_seed(6)
    for new_lens in ([2048, 700, 0, 1], [5, 2048, 2048, 1999], [1024, 1024, 3, 2048]):
        idx.copy_(_lists(live, 4, 2048, cache.num_slots, g))
        lengths.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=g).bfloat16())
        cache.store(0, torch.randn(len(live), 512, generator=g).bfloat16().cuda(),
                    torch.randn(len(live), 64, generator=g).bfloat16().cuda(), live.cuda())
        graph.replay()
        _check(cache, q, idx, lengths, out, lse)


def test_sparse_mma8_timeline_stamps_in_order(monkeypatch):
    """`DecodePlan.timeline` on the sparse ≤ 8-row kernel (`benchmarks/timeline.py`'s sparse
    cases): every program stamps entry ≤ loop start ≤ tile 0 landed ≤ loop end ≤ exit, within
    a second, and an SM id; the outputs still match; a timeline of the wrong shape is
    refused."""
    _force(monkeypatch, "mma8")
    cache, _, q, idx = sparse_problem("fp8_ds_mla", 4, 8, 2048, seed=41)
    plan = SparsePlan(num_queries=4, num_heads=8, topk=2048, kv_format=cache.fmt,
                      device="cuda", num_splits=3)
    _served_by(plan, "mma8")
    plan.timeline = torch.full((4 * 2, 12), -1, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="timeline"):
        plan.run(q, cache.layer(0), idx, check=False)
    plan.timeline = torch.full((4 * 3, 12), -1, dtype=torch.int64, device="cuda")
    out, lse = plan.run(q, cache.layer(0), idx, check=False)
    _check(cache, q, idx, None, out, lse)
    assert_timeline_in_order(plan.timeline)
