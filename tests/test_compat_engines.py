"""The compat APIs as serving engines call them today: sgl_kernel's earlier FlashMLA interface
(tensor schedules, SGLang), vLLM's batch-invariant schedule, attention sinks on queries with
nothing to attend, and DeepGEMM's current indexer entry points (2-D context lengths, any
next_n, the ``fp8_fp4_*`` forms, ``max_seqlen_k``, upstream argument names)."""

import pytest
import torch

from fp8mla import reference
from fp8mla.compat import deep_gemm, flash_mla, sgl_flash_mla
from fp8mla.formats import dequantize_kv, quantize_index_keys
from fp8mla.testing import assert_close
from helpers import index_cache, indexer_reference_paged, paged_cache
from test_compat import _flashmla_fp8_cache


def _dense_case(device, lens=(70, 5, 33), heads=3, s_q=2, seed=2):
    cache, table, seqlens = paged_cache("fp8_ds_mla", list(lens), 16, device=device, seed=seed)
    q = torch.randn(len(lens), s_q, heads, 576,
                    generator=torch.Generator().manual_seed(seed)).bfloat16().to(device)
    return cache, table, seqlens, q


def test_sink_on_a_query_with_nothing_attended_keeps_out_zero(device):
    """FlashMLA zeroes a lonely query's output whatever its sink: a sink of +inf on a query
    whose lse is +inf (nothing attended) gave NaN (e^(inf − inf))."""
    k_cache = _flashmla_fp8_cache(2, 64, device)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 1, 4, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(0, 128, (2, 1, 8), generator=g, dtype=torch.int32).to(device)
    idx[1] = -1  # request 1 attends nothing
    sink = torch.tensor([float("inf"), float("-inf"), 0.5, float("inf")], device=device)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512,
                                                flash_mla.get_mla_metadata()[0],
                                                is_fp8_kvcache=True, indices=idx, attn_sink=sink)
    assert not out.isnan().any()
    assert torch.all(out[1] == 0) and torch.all(lse[1] == float("inf"))
    kv = dequantize_kv(k_cache.view(-1, 656).cpu(), "fp8_ds_mla").to(device)
    ro, rl = reference.sparse_mla(q[0], kv, idx[0], 576 ** -0.5)
    factor = 1.0 / (1.0 + torch.exp(sink - rl[0]))  # sink +inf: 0; −inf: 1
    assert_close(out[0, 0], ro[0] * factor[:, None], name="out")
    assert torch.all(out[0, 0, 0] == 0) and torch.all(out[0, 0, 3] == 0)


def test_earlier_interface_schedules_are_tensors_callers_can_copy(device):
    """sgl_kernel's get_mla_metadata returns (tile_scheduler_metadata int32 [parts, 8],
    num_splits int32 [batch + 1]) which SGLang copies into its graph buffers and slices;
    fp8mla's are zeros of those shapes, on cache_seqlens's device."""
    seqlens = torch.tensor([5, 9, 70], dtype=torch.int32, device=device)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 2 * 8, 1)
    assert meta.dtype == splits.dtype == torch.int32
    assert meta.shape[1] == sgl_flash_mla.SCHEDULE_WORDS and meta.shape[0] >= 1
    assert splits.shape == (4,) and meta.device == splits.device == seqlens.device
    assert not meta.any() and not splits.any()
    sparse_meta, _ = sgl_flash_mla.get_mla_metadata(cache_seqlens=seqlens,
                                                    num_q_tokens_per_head_k=64, topk=2048)
    buffer = torch.ones_like(sparse_meta)
    buffer.copy_(sparse_meta)  # what NSAFlashMLAMetadata.copy_ does
    with pytest.raises(ValueError, match=r"num_q_tokens_per_head_k: expected an int in \[1, inf\], got 0"):
        sgl_flash_mla.get_mla_metadata(seqlens, 0, 1)
    with pytest.raises(TypeError, match="cache_seqlens: expected a torch.Tensor, got list"):
        sgl_flash_mla.get_mla_metadata([5, 9], 16, 1)


def test_earlier_interface_dense_and_sparse_match_the_reference(device):
    """flash_mla_with_kvcache with the earlier interface's tensors: dense (causal MTP) and
    sparse decode against the float32 reference; one plan per problem shape, reused by the
    next call of that shape with new lengths."""
    cache, table, seqlens, q = _dense_case(device)
    k_cache = cache.layer(0).unsqueeze(2)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 2 * 3, 1)
    plans = flash_mla._TENSOR_SCHEDULE_PLANS
    out, lse = sgl_flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, splits,
                                                    causal=True, is_fp8_kvcache=True)
    kv = cache.dequantize(0)
    ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl.transpose(1, 2), atol=1e-3, rtol=1e-3, name="lse")
    kept = dict(plans.plans)
    shorter = seqlens - torch.tensor([60, 0, 20], dtype=torch.int32, device=device)
    out, _ = sgl_flash_mla.flash_mla_with_kvcache(q, k_cache, table, shorter, 512, meta, splits,
                                                  causal=True, is_fp8_kvcache=True)
    assert dict(plans.plans) == kept  # the same plan, new lengths
    assert_close(out, reference.dense_mla_decode(q, kv, table, shorter, 576 ** -0.5)[0])

    k8 = _flashmla_fp8_cache(4, 64, device)
    g = torch.Generator().manual_seed(9)
    qs = torch.randn(2, 1, 8, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, 256, (2, 1, 40), generator=g, dtype=torch.int32).to(device)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens[:2], 8, 1, 8, True, 40)
    out, lse = sgl_flash_mla.flash_mla_with_kvcache(qs, k8, None, None, 512, meta, splits,
                                                    is_fp8_kvcache=True, indices=idx)
    kvs = dequantize_kv(k8.view(-1, 656).cpu(), "fp8_ds_mla").to(device)
    ro, rl = reference.sparse_mla(qs[:, 0], kvs, idx[:, 0], 576 ** -0.5)
    assert_close(out[:, 0], ro, name="out")
    assert_close(lse[:, :, 0], rl, atol=1e-3, rtol=1e-3, name="lse")
    # the current interface's schedule object is taken by the same entry point
    out2, _ = sgl_flash_mla.flash_mla_with_kvcache(qs, k8, None, None, 512,
                                                   flash_mla.get_mla_metadata()[0],
                                                   is_fp8_kvcache=True, indices=idx)
    assert_close(out2, out, atol=0, rtol=0)


def test_earlier_interface_bad_schedules_and_descales_name_the_argument(device):
    cache, table, seqlens, q = _dense_case(device, lens=(20, 9), s_q=1)
    k_cache = cache.layer(0).unsqueeze(2)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 3, 1)
    call = sgl_flash_mla.flash_mla_with_kvcache
    with pytest.raises(TypeError, match=r"num_splits: with a tile_scheduler_metadata tensor .* "
                                        r"got NoneType"):
        call(q, k_cache, table, seqlens, 512, meta, None, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match=r"num_splits: must be None with a FlashMLASchedMeta"):
        call(q, k_cache, table, seqlens, 512, flash_mla.get_mla_metadata()[0], splits,
             is_fp8_kvcache=True)
    with pytest.raises(TypeError, match=r"tile_scheduler_metadata: expected the "
                                        r"FlashMLASchedMeta .* got list"):
        call(q, k_cache, table, seqlens, 512, [0], splits, is_fp8_kvcache=True)
    scale = torch.ones(2, device=device)
    with pytest.raises(ValueError, match=r"descale_q, descale_k: expected both or neither"):
        call(q, k_cache, table, seqlens, 512, meta, splits, descale_q=scale,
             is_fp8_kvcache=True)
    q8 = q.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"descale_k: expected shape \[1\], got \[2\]"):
        call(q8, k_cache, table, seqlens, 512, meta, splits, descale_q=scale, descale_k=scale)
    with pytest.raises(ValueError, match=r"descale_q: expected float32 \[1\] or \[2\], got "
                                         r"\[3\]"):
        call(q8, k_cache, table, seqlens, 512, meta, splits, descale_q=torch.ones(3, device=device),
             descale_k=scale[:1])
    with pytest.raises(ValueError, match=r"q: float8_e4m3fn q serves dense decode only"):
        call(q8, k_cache, None, None, 512, meta, splits,
             indices=torch.zeros(2, 1, 4, dtype=torch.int32, device=device))


def test_earlier_interface_fp8_path_reads_the_pool_with_its_descales(device):
    """sgl_kernel's FP8 dense path (SGLang's FlashMLA backend over an FP8 pool; disabled in
    sgl_kernel itself): e4m3 q with descale_q over 576-byte e4m3 rows whose scale is
    descale_k, read directly — against the reference over the dequantized q and pool. With
    bf16 q the descales are not read, as in sgl_kernel."""
    cache, table, seqlens = paged_cache("fp8", [70, 5, 33], 64, device=device, seed=21,
                                        fp8_scale=0.05)
    k_cache = cache.layer(0).view(torch.float8_e4m3fn).unsqueeze(2)  # [pages, 64, 1, 576]
    g = torch.Generator().manual_seed(22)
    q = torch.randn(3, 2, 4, 576, generator=g).bfloat16().to(device)
    q_scale = torch.tensor([0.02, 0.03, 0.01], device=device)  # per request
    q8 = (q.float() / q_scale.view(-1, 1, 1, 1)).to(torch.float8_e4m3fn)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 2 * 4, 1)
    out, lse = sgl_flash_mla.flash_mla_with_kvcache(
        q8, k_cache, table, seqlens, 512, meta, splits, causal=True,
        descale_q=q_scale, descale_k=cache.scale(0))
    q_seen = (q8.float() * q_scale.view(-1, 1, 1, 1)).bfloat16()
    ro, rl = reference.dense_mla_decode(q_seen, cache.dequantize(0), table, seqlens, 576 ** -0.5)
    assert_close(out, ro, name="out")
    assert_close(lse, rl.transpose(1, 2), atol=1e-3, rtol=1e-3, name="lse")
    unscaled, _ = sgl_flash_mla.flash_mla_with_kvcache(
        q8, k_cache, table, seqlens, 512, meta, splits, causal=True,
        descale_q=torch.ones(1, device=device), descale_k=torch.ones(1, device=device))
    assert not torch.allclose(unscaled.float(), out.float(), atol=1e-2)  # the scales were read
    bf16, _ = sgl_flash_mla.flash_mla_with_kvcache(
        q_seen, k_cache, table, seqlens, 512, meta, splits, causal=True, is_fp8_kvcache=True,
        descale_q=q_scale, descale_k=cache.scale(0))
    plain, _ = sgl_flash_mla.flash_mla_with_kvcache(
        q_seen, k_cache, table, seqlens, 512, meta, splits, causal=True, is_fp8_kvcache=True)
    assert torch.equal(bf16, plain)


def _one_partition_meta(device):
    """A FlashMLASchedMeta whose schedule its caller set to one partition, as vLLM's
    batch-invariant mode does."""
    meta = flash_mla.get_mla_metadata()[0]
    meta.tile_scheduler_metadata = torch.zeros(1, 8, dtype=torch.int32, device=device)
    meta.num_splits = torch.zeros(4, dtype=torch.int32, device=device)
    return meta


def test_schedule_with_forced_tensors_gives_batch_invariant_results(device):
    """vLLM's batch-invariant mode sets a FlashMLASchedMeta's tile_scheduler_metadata /
    num_splits to force one partition: fp8mla then plans one split per request and picks its
    kernel whatever the table's width, so a request's output is bit for bit the same alone
    (over a table of its own pages) or in a batch."""
    cache, table, seqlens, q = _dense_case(device, lens=(300, 41, 170), s_q=1, heads=8)
    k_cache = cache.layer(0).unsqueeze(2)
    meta = _one_partition_meta(device)
    batch, _ = flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta,
                                                causal=True, is_fp8_kvcache=True)
    assert meta.plan.num_splits == 1
    for b in range(3):  # alone, over a table only as wide as the request's own pages
        pages = -(-int(seqlens[b]) // 16)
        alone, _ = flash_mla.flash_mla_with_kvcache(q[b:b + 1], k_cache, table[b:b + 1, :pages],
                                                    seqlens[b:b + 1], 512,
                                                    _one_partition_meta(device),
                                                    causal=True, is_fp8_kvcache=True)
        assert torch.equal(alone[0], batch[b]), b
    plain = flash_mla.get_mla_metadata()[0]
    flash_mla.flash_mla_with_kvcache(q[:1], k_cache, table[:1], seqlens[:1], 512, plain,
                                     causal=True, is_fp8_kvcache=True)
    assert plain.plan.num_splits > 1  # what the forced schedule turned off: 300 tokens split
    multi = flash_mla.get_mla_metadata()[0]  # a caller-set schedule of several parts: not read
    multi.tile_scheduler_metadata = torch.zeros(3, 8, dtype=torch.int32, device=device)
    multi.num_splits = torch.zeros(2, dtype=torch.int32, device=device)
    flash_mla.flash_mla_with_kvcache(q[:1], k_cache, table[:1], seqlens[:1], 512, multi,
                                     causal=True, is_fp8_kvcache=True)
    assert multi.plan.num_splits == plain.plan.num_splits


@pytest.mark.parametrize("asked_by", ["schedule", "environment"])
def test_forced_schedule_makes_sparse_decode_batch_invariant(device, asked_by, monkeypatch):
    """The same for sparse decode: 16 heads of fp8_ds_mla lists, where on SM90 a batch of at
    most `SPARSE_SM90_SMALL_BATCH` queries took another kernel than a larger one (the result
    changed with the batch size until session 49); 34 queries against each alone — asked by
    the caller's schedule or by vLLM's environment variable."""
    k_cache = _flashmla_fp8_cache(4, 64, device)
    g = torch.Generator().manual_seed(12)
    q = torch.randn(34, 1, 16, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, 256, (34, 1, 40), generator=g, dtype=torch.int32).to(device)
    if asked_by == "environment":
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")

    def forced():
        return (_one_partition_meta(device) if asked_by == "schedule"
                else flash_mla.get_mla_metadata()[0])

    meta = forced()
    batch, _ = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx)
    assert meta.plan.num_splits == 1 and meta.plan.batch_invariant
    assert meta.plan.out is None  # (every call is given fresh outputs)
    for b in (0, 21, 33):
        alone, _ = flash_mla.flash_mla_with_kvcache(q[b:b + 1], k_cache, None, None, 512,
                                                    forced(), is_fp8_kvcache=True,
                                                    indices=idx[b:b + 1])
        assert torch.equal(alone[0], batch[b]), b


def test_environment_makes_sparse_prefill_and_earlier_interface_batch_invariant(
        device, monkeypatch):
    """With FP8MLA_BATCH_INVARIANT (or vLLM's VLLM_BATCH_INVARIANT) set, flash_mla_sparse_fwd
    runs one split a token whatever the token count (FlashMLA's sparse prefill never splits:
    one token of 8 heads otherwise takes several splits here), and the earlier interface's
    dense plans one split a request: each token's / request's output is bit for bit the same
    alone or in the call."""
    monkeypatch.setenv("FP8MLA_BATCH_INVARIANT", "1")
    k_cache = _flashmla_fp8_cache(4, 64, device)
    kv = k_cache.view(-1, 1, 656)
    g = torch.Generator().manual_seed(13)
    q = torch.randn(5, 8, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, 256, (5, 1, 300), generator=g, dtype=torch.int32).to(device)
    out, _, _ = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 576 ** -0.5)
    for t in (0, 4):
        alone, _, _ = flash_mla.flash_mla_sparse_fwd(q[t:t + 1], kv, idx[t:t + 1], 576 ** -0.5)
        assert torch.equal(alone[0], out[t]), t
    cache, table, seqlens, qd = _dense_case(device, lens=(300, 41, 170), s_q=1, heads=8)
    k_dense = cache.layer(0).unsqueeze(2)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 8, 1)
    batch, _ = sgl_flash_mla.flash_mla_with_kvcache(qd, k_dense, table, seqlens, 512, meta,
                                                    splits, causal=True, is_fp8_kvcache=True)
    for b in range(3):
        pages = -(-int(seqlens[b]) // 16)
        alone, _ = sgl_flash_mla.flash_mla_with_kvcache(
            qd[b:b + 1], k_dense, table[b:b + 1, :pages], seqlens[b:b + 1], 512, meta, splits,
            causal=True, is_fp8_kvcache=True)
        assert torch.equal(alone[0], batch[b]), b
    monkeypatch.setenv("FP8MLA_BATCH_INVARIANT", "0")
    assert not flash_mla.invariant_mode()


def test_dense_decode_reads_tables_by_their_row_stride(device):
    """FlashMLA reads a block table by its row stride and the lengths alone: SGLang captures
    its graphs with a one-page view of its full-width table buffer and replays them with
    longer tables written into the buffer. fp8mla widens such a view to its rows (a view, no
    copy), so the lengths decide what is read, as in FlashMLA — both interfaces."""
    cache, table, seqlens, q = _dense_case(device, lens=(70, 5, 33), s_q=1)
    k_cache = cache.layer(0).unsqueeze(2)
    want = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 576 ** -0.5)[0]
    narrow = table[:, :1]  # the capture's view: one page of each row
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 3, 1)
    for schedule in ((meta, splits), (flash_mla.get_mla_metadata()[0], None)):
        out, _ = flash_mla.flash_mla_with_kvcache(q, k_cache, narrow, seqlens, 512, *schedule,
                                                  causal=True, is_fp8_kvcache=True)
        assert_close(out, want, name="out")
    one = table[1:2, :1]  # a single row keeps its row's width, not the rest of the buffer
    assert flash_mla._whole_rows(one).shape == (1, table.shape[1])
    assert flash_mla._whole_rows(table.clone()[:, :2].contiguous()).shape == (3, 2)  # its own


def _paged_case(device, lens=(70, 30), heads=4, next_n=2, seed=5):
    cache, table = index_cache(list(lens), 16, device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), next_n, heads, 128, generator=g).to(torch.float8_e4m3fn)
    w = torch.rand(len(lens) * next_n, heads, generator=g)
    return cache, table, q.to(device), w.to(device)


def test_deep_gemm_two_dimensional_context_lens(device):
    """DeepGEMM now takes context_lens [B, next_n], each query's own length (vLLM and SGLang
    pass it so; [B, 1] at next_n 1): the same logits as the 1-D form where they agree, and each
    query's own window where they do not."""
    cache, table, q, w = _paged_case(device)
    view = cache.deep_gemm_view(0)
    lens = torch.tensor([70, 30], dtype=torch.int32, device=device)
    one = deep_gemm.fp8_paged_mqa_logits(q, view, w, lens, table, None, 80)
    two = deep_gemm.fp8_paged_mqa_logits(q, view, w, torch.stack([lens - 1, lens], 1), table,
                                         None, 80)
    assert torch.equal(one, two)
    odd = [[12, 70], [30, 3]]  # not the causal staircase: each query its own length
    got = deep_gemm.fp8_paged_mqa_logits(
        q, view, w, torch.tensor(odd, dtype=torch.int32, device=device), table, None, 80)
    assert_close(got, indexer_reference_paged(cache, table, odd, q, w, 2, 80), atol=1e-3,
                 rtol=1e-3)
    single = deep_gemm.fp8_paged_mqa_logits(q[:, :1].contiguous(), view, w.view(2, 2, 4)[:, 0],
                                            lens[:, None], table, None, 80)
    assert_close(single, indexer_reference_paged(cache, table, [70, 30], q[:, :1],
                                                 w.view(2, 2, 4)[:, 0], 1, 80), atol=1e-3, rtol=1e-3)
    column = torch.stack([lens, lens + 5], 1)[:, :1]  # [B, 1], a column of a wider buffer
    assert torch.equal(deep_gemm.fp8_paged_mqa_logits(q[:, :1].contiguous(), view,
                                                      w.view(2, 2, 4)[:, 0], column, table,
                                                      None, 80), single)
    with pytest.raises(ValueError, match=r"block_table: expected shape \[2, \*\], got \[3, "):
        deep_gemm.fp8_paged_mqa_logits(q, view, w, torch.stack([lens, lens], 1),
                                       torch.cat([table, table[:1]]), None, 80)
    with pytest.raises(ValueError, match=r"context_lens: expected int32 \[2, 2\] or \[2\], "
                                         r"got \[2, 3\]"):
        deep_gemm.fp8_paged_mqa_logits(q, view, w, torch.zeros(2, 3, dtype=torch.int32,
                                                                device=device), table, None, 80)


def test_deep_gemm_serves_any_next_n(device):
    """MTP with more than 3 draft tokens: next_n 6 (the kernels' causal form takes ≤ 4 queries
    a request; above, each query's length is computed) against the reference, 1-D and 2-D
    lengths alike."""
    cache, table, q, w = _paged_case(device, next_n=6, seed=8)
    view = cache.deep_gemm_view(0)
    lens = torch.tensor([70, 4], dtype=torch.int32, device=device)  # request 1: 4 < next_n
    got = deep_gemm.fp8_paged_mqa_logits(q, view, w, lens, table, None, 72)
    want = indexer_reference_paged(cache, table, [70, 4], q, w, 6, 72)
    assert_close(got, want, atol=1e-3, rtol=1e-3)
    steps = torch.arange(-5, 1, dtype=torch.int32, device=device)
    lens2d = (lens[:, None] + steps).clamp_min(0)
    assert torch.equal(deep_gemm.fp8_paged_mqa_logits(q, view, w, lens2d, table, None, 72), got)


def test_deep_gemm_current_entry_points_and_names(device):
    """The fp8_fp4_* forms (q as (values, None)) and DeepGEMM's keyword names; bf16 logits;
    FP4 queries, variable-length ``indices`` and other dtypes refused by name."""
    cache, table, q, w = _paged_case(device)
    view = cache.deep_gemm_view(0)
    lens = torch.tensor([[69, 70], [29, 30]], dtype=torch.int32, device=device)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 16, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32
    base = deep_gemm.fp8_paged_mqa_logits(q=q, kv_cache=view, weights=w, context_lens=lens,
                                          block_table=table, schedule_meta=meta,
                                          max_context_len=80, clean_logits=False)
    new = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), view, w, lens, table, meta, 80)
    assert torch.equal(new, base)
    half = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), view, w, lens, table, meta, 80,
                                              logits_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, base.bfloat16())
    with pytest.raises(ValueError, match=r"q: FP4 queries with MX scales \(q\[1\]\) are not"):
        deep_gemm.fp8_fp4_paged_mqa_logits((q, torch.zeros(2, 2, 4, dtype=torch.int32)), view,
                                           w, lens, table, meta, 80)
    with pytest.raises(TypeError, match=r"q: expected a pair \(values, scales or None\), got "
                                        r"Tensor"):
        deep_gemm.fp8_fp4_paged_mqa_logits(q, view, w, lens, table, meta, 80)
    with pytest.raises(ValueError, match=r"indices: DeepGEMM's variable-length batches"):
        deep_gemm.fp8_paged_mqa_logits(q, view, w, lens, table, meta, 80,
                                       indices=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"logits_dtype: expected torch.float32 or "
                                         r"torch.bfloat16, got torch.float16"):
        deep_gemm.fp8_fp4_paged_mqa_logits((q, None), view, w, lens, table, meta, 80,
                                           logits_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^max_context_len: expected an int in \[0, inf\], got -1"):
        deep_gemm.fp8_paged_mqa_logits(q, view, w, lens, table, meta, -1)
    deep_gemm.set_num_sms(100)
    try:
        assert deep_gemm.get_num_sms() == 100
    finally:
        deep_gemm._num_sms = None
    with pytest.raises(ValueError, match=r"num_sms: expected an int in \[1, inf\], got 0"):
        deep_gemm.set_num_sms(0)


def _ragged_case(device, seed=11):
    g = torch.Generator().manual_seed(seed)
    kbytes, kscales = quantize_index_keys(torch.randn(50, 128, generator=g))
    q = torch.randn(5, 8, 128, generator=g).to(torch.float8_e4m3fn)
    w = torch.rand(5, 8, generator=g)
    ks = torch.tensor([0, 4, 9, 30, 50], dtype=torch.int32)
    ke = torch.tensor([50, 4, 20, 41, 50], dtype=torch.int32)
    keys = kbytes.view(torch.float8_e4m3fn).float() * kscales[:, None]
    want = reference.indexer_logits(q.float(), w, keys, ks, ke)
    kv = (kbytes.to(device), kscales.to(device))
    return q.to(device), kv, w.to(device), ks.to(device), ke.to(device), want


@pytest.mark.parametrize("chunk", [None, 1100])
def test_deep_gemm_max_seqlen_k_counts_columns_from_each_rows_start(device, chunk, monkeypatch):
    """fp8_mqa_logits(max_seqlen_k=m): [seq_len, m], column j of row t the key start[t] + j,
    −inf past the row's window — the full logits' windows shifted to column 0 (taken a bounded
    number of rows at a time: ``chunk`` bytes force two rows a chunk); windows past the keys
    are −inf there, not the last key repeated."""
    if chunk:
        monkeypatch.setattr(deep_gemm, "CHUNK_BYTES", chunk)
    q, kv, w, ks, ke, want = _ragged_case(device)
    full = deep_gemm.fp8_mqa_logits(q, kv, w, cu_seq_len_k_start=ks, cu_seq_len_k_end=ke)
    assert_close(full, want, atol=1e-3, rtol=1e-3)
    past = ke.clone()
    past[0] = 60  # a window past the 50 keys (unchecked, as DeepGEMM): −inf there
    wide = deep_gemm.fp8_mqa_logits(q, kv, w, ks, past, False, 64)
    assert torch.equal(wide[0, :50], full[0]) and torch.all(wide[0, 50:] == float("-inf"))
    got = deep_gemm.fp8_mqa_logits(q, kv, w, ks, ke, False, 24)
    assert got.shape == (5, 24)
    for t in range(5):
        n = int(ke[t] - ks[t])
        assert torch.equal(got[t, :min(n, 24)], full[t, int(ks[t]):int(ks[t]) + min(n, 24)])
        assert torch.all(got[t, n:] == float("-inf"))
    new = deep_gemm.fp8_fp4_mqa_logits((q, None), kv, w, ks, ke, max_seqlen_k=24,
                                       logits_dtype=torch.bfloat16)
    assert torch.equal(new, got.bfloat16())
    with pytest.raises(ValueError, match=r"cu_seq_len_k_end: expected shape \[5\], got \[4\]"):
        deep_gemm.fp8_mqa_logits(q, kv, w, ks, ke[:4], False, 24)
    with pytest.raises(ValueError, match=r"max_seqlen_k: expected an int in \[0, inf\], got -3"):
        deep_gemm.fp8_mqa_logits(q, kv, w, ks, ke, False, -3)


@pytest.mark.parametrize("s_q,causal", [(6, True), (9, True), (5, False)])
def test_dense_decode_serves_any_s_q(device, s_q, causal):
    """FlashMLA's dense decode takes any s_q (vLLM sends uniform batches of up to 128 queries a
    request to it); fp8mla's kernels take ≤ 4 a request, so the compat call runs them in runs
    of 4 — query i still sees cache_seqlens − s_q + 1 + i tokens (causal) or all of them."""
    cache, table, seqlens, q = _dense_case(device, lens=(70, 12, 33), s_q=s_q, seed=s_q)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, s_q * 3, 1)
    for schedule in ((meta, splits), (flash_mla.get_mla_metadata()[0], None)):
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache.layer(0).unsqueeze(2), table,
                                                    seqlens, 512, *schedule, causal=causal,
                                                    is_fp8_kvcache=True)
        kv = cache.dequantize(0)
        if causal:
            ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
        else:
            parts = [reference.dense_mla_decode(q[:, i:i + 1], kv, table, seqlens, 576 ** -0.5)
                     for i in range(s_q)]
            ro, rl = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
        assert_close(out, ro, name="out")
        assert_close(lse, rl.transpose(1, 2).masked_fill(rl.transpose(1, 2) == float("-inf"),
                                                         float("inf")),
                     atol=1e-3, rtol=1e-3, name="lse")


def test_earlier_interface_plans_are_keyed_by_what_changes_the_answer(device, monkeypatch):
    """The earlier interface's shared plans differ by softmax scale, KV format and table span
    (a power of two: widths of 48 and 64 tokens share one): a call never runs another
    problem's plan. (Found by mutation testing: dropping a key part passed every test.)"""
    cache, table, seqlens, q = _dense_case(device, lens=(40, 5, 33), s_q=1, seed=6)
    k_cache = cache.layer(0).unsqueeze(2)
    from fp8mla._plans import PlanCache

    plans = PlanCache()  # this test's own: the counts below are its plans alone
    monkeypatch.setattr(flash_mla, "_TENSOR_SCHEDULE_PLANS", plans)
    meta, splits = sgl_flash_mla.get_mla_metadata(seqlens, 3, 1)

    def call(k, tbl, lens=seqlens, **kw):
        return sgl_flash_mla.flash_mla_with_kvcache(q, k, tbl, lens, 512, meta, splits,
                                                    causal=True, is_fp8_kvcache=True, **kw)[0]

    call(k_cache, table)
    out = call(k_cache, table, softmax_scale=0.3)
    assert_close(out, reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens, 0.3)[0])
    fp8, table8, _ = paged_cache("fp8", [40, 5, 33], 16, device=device, seed=7, fp8_scale=1.0)
    out = call(fp8.layer(0).unsqueeze(2), table8)
    assert_close(out, reference.dense_mla_decode(q, fp8.dequantize(0), table8, seqlens,
                                                 576 ** -0.5)[0])
    call(k_cache, table[:, :3].contiguous())  # 48 tokens: the 64-token plan
    n = len(plans.plans)
    call(k_cache, table[:, :4].contiguous())
    assert len(plans.plans) == n
    lens = seqlens.clamp_max(16)
    call(k_cache, table[:, :1].contiguous(), lens)  # 16 tokens: a plan of its own
    assert len(plans.plans) == n + 1


def test_compat_edge_rules_found_by_mutation_testing(device, monkeypatch):
    """Rules no test pinned down before (each mutated away, the suite passed): a sink of the
    wrong size is refused, not broadcast; a table view is widened only within its storage; a
    one-element schedule is not a one-partition one; s_q 4 is one plan reused across calls;
    causal runs of queries past a short request give it nothing to attend even under the
    validating mode; windows over no keys are all −inf; the gather takes as many rows a chunk
    as its byte bound allows; get_num_sms without a GPU says so; plans evict least recently
    used first; sgl_kernel's schedule parts follow SMs / h_k / ⌈rows / 64⌉."""
    from fp8mla import numerics
    from fp8mla._plans import PlanCache
    from fp8mla.decode import DecodePlan
    from fp8mla.runtime import target_for

    k8 = _flashmla_fp8_cache(2, 64, device)
    q1 = torch.randn(1, 1, 4, 576).bfloat16().to(device)
    idx = torch.zeros(1, 1, 8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"attn_sink: expected float32 \[4\]"):
        flash_mla.flash_mla_with_kvcache(q1, k8, None, None, 512, flash_mla.get_mla_metadata()[0],
                                         is_fp8_kvcache=True, indices=idx,
                                         attn_sink=torch.zeros(1, device=device))
    t = torch.arange(12, dtype=torch.int32, device=device).view(3, 4)
    assert flash_mla._whole_rows(t[:, 1:2]).shape == (3, 3)  # the last row has 3 left
    assert not flash_mla._single_partition(torch.zeros(1, dtype=torch.int32))

    cache, table, seqlens, q = _dense_case(device, lens=(30, 5), s_q=4)
    meta, plans = flash_mla.get_mla_metadata()[0], []
    for lens in (seqlens, seqlens - 1):
        flash_mla.flash_mla_with_kvcache(q, cache.layer(0).unsqueeze(2), table, lens, 512, meta,
                                         causal=True, is_fp8_kvcache=True)
        plans.append(meta.plan)
    assert isinstance(plans[0], DecodePlan) and plans[1] is plans[0]

    cache, table, seqlens, q = _dense_case(device, lens=(70, 3, 33), s_q=9, seed=9)
    numerics.enable(True)
    try:
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache.layer(0).unsqueeze(2), table,
                                                    seqlens, 512, flash_mla.get_mla_metadata()[0],
                                                    causal=True, is_fp8_kvcache=True)
    finally:
        numerics.enable(None)
    assert torch.all(out[1, :6] == 0) and torch.all(lse[1, :, :6] == float("inf"))

    q3 = torch.randn(3, 8, 128).to(torch.float8_e4m3fn).to(device)
    none = (torch.zeros(0, 128, dtype=torch.uint8, device=device),
            torch.zeros(0, device=device))
    z = torch.zeros(3, dtype=torch.int32, device=device)
    got = deep_gemm.fp8_mqa_logits(q3, none, torch.rand(3, 8, device=device), z, z, False, 4)
    assert got.shape == (3, 4) and torch.all(got == float("-inf"))
    monkeypatch.setattr(deep_gemm, "CHUNK_BYTES", 2 * (4 * 50 + 13 * 24))
    calls = []

    def logits_of(r0, r1):
        calls.append((r0, r1))
        return torch.zeros(r1 - r0, 50, device=device)

    s = torch.zeros(5, dtype=torch.int32, device=device)
    deep_gemm._windows(logits_of, s, s + 50, 50, 24)
    assert calls == [(0, 2), (2, 4), (4, 5)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(deep_gemm, "_num_sms", None)
    with pytest.raises(RuntimeError, match="get_num_sms: no CUDA GPU here"):
        deep_gemm.get_num_sms()
    monkeypatch.undo()

    c = PlanCache()
    first = {i: c.get(i, object) for i in range(PlanCache.KEEP)}
    c.get(0, object)  # used again: the least recently used is now 1
    c.get(PlanCache.KEEP, object)
    assert c.get(0, object) is first[0] and 1 not in c.plans

    s2 = torch.tensor([5, 9], dtype=torch.int32, device=device)
    sms = target_for(s2.device).num_sms
    assert sgl_flash_mla.get_mla_metadata(s2, 64, 1)[0].shape[0] == sms
    assert sgl_flash_mla.get_mla_metadata(s2, 65, 1)[0].shape[0] == max(1, sms // 2)
    assert sgl_flash_mla.get_mla_metadata(s2, 128, 2)[0].shape[0] == max(1, sms // 2 // 2)
    assert sgl_flash_mla.get_mla_metadata(s2, 64 * (sms + 1), 1)[0].shape[0] == 1
