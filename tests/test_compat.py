"""Drop-in FlashMLA / DeepGEMM APIs, with inputs laid out as their own tests lay them out."""

import pytest
import torch

from fp8mla import reference
from fp8mla.compat import deep_gemm, flash_mla
from fp8mla.formats import dequantize_kv, quantize_index_keys, quantize_kv
from fp8mla.testing import assert_close
from helpers import index_cache, paged_cache


def _flashmla_fp8_cache(num_blocks, page, device, seed=0):
    """A FlashMLA-style sparse FP8 cache: bf16 rows quantized to 656 bytes with pow2 scales
    (FlashMLA's tests/quant.py layout), shaped [num_blocks, page, 1, 656]."""
    g = torch.Generator().manual_seed(seed)
    n = num_blocks * page
    rows = quantize_kv(torch.randn(n, 512, generator=g), torch.randn(n, 64, generator=g),
                       "fp8_ds_mla")
    return rows.view(num_blocks, page, 1, 656).to(device)


def _sink_ref(out, lse, sink):
    """FlashMLA's reference: out · 1 / (1 + e^(sink − lse)); lonely queries: out 0, lse +inf."""
    out = out * (1.0 / (1.0 + torch.exp(sink.view(1, 1, -1) - lse))).unsqueeze(-1)
    out = torch.nan_to_num(out, nan=0.0)
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def test_sparse_decode_flashmla_layout(device):
    b, s_q, h, topk, page = 2, 2, 8, 24, 64  # 8 heads: FlashMLA itself refuses (64/128 only)
    k_cache = _flashmla_fp8_cache(4, page, device)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, s_q, h, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(0, 4 * page, (b, s_q, topk), generator=g, dtype=torch.int32)
    idx[0, 1, :5] = -1
    idx[1, 0] = -1  # a lonely query
    idx = idx.to(device)
    topk_length = torch.tensor([20, 24], dtype=torch.int32, device=device)
    sink = torch.randn(h, generator=g).to(device)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta,
                                                is_fp8_kvcache=True, indices=idx,
                                                topk_length=topk_length, attn_sink=sink)
    assert out.shape == (b, s_q, h, 512) and lse.shape == (b, h, s_q)
    kv = dequantize_kv(k_cache.view(-1, 656).cpu(), "fp8_ds_mla").to(device)
    ro, rl = reference.sparse_mla(q.view(-1, h, 576), kv, idx.view(-1, topk), 576 ** -0.5,
                                  topk_length.repeat_interleave(s_q))
    ro, rl = _sink_ref(ro.view(b, s_q, h, 512), rl.view(b, s_q, h), sink)
    assert_close(out, ro, name="out")
    assert_close(lse, rl.transpose(1, 2), atol=1e-3, rtol=1e-3, name="lse")
    assert torch.all(lse[1, :, 0] == float("inf")) and torch.all(out[1, 0] == 0)
    # the schedule is reusable with new contents; inconsistent shapes raise
    out2, _ = flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta,
                                               is_fp8_kvcache=True, indices=idx.flip(-1),
                                               topk_length=topk_length, attn_sink=sink)
    assert out2.data_ptr() != out.data_ptr()  # fresh outputs per call (layers keep theirs)
    with pytest.raises(ValueError, match=r"tile_scheduler_metadata: built for h_q=8, called "
                                         r"with 16.*inconsistent with sched_meta"):
        flash_mla.flash_mla_with_kvcache(q.repeat(1, 1, 2, 1), k_cache, None, None, 512, meta,
                                         is_fp8_kvcache=True, indices=idx)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_decode_flashmla_layout(device, fmt, causal):
    cache, table, seqlens = paged_cache(fmt, [70, 5], 16, device=device, seed=2)
    rows = cache.layer(0)
    k_cache = (rows.view(torch.bfloat16) if fmt == "bf16" else rows).unsqueeze(2)
    q = torch.randn(2, 2, 3, 576).bfloat16().to(device)
    meta, _ = flash_mla.get_mla_metadata(seqlens, 2 * 3, 1)  # old-style arguments are ignored
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta,
                                                causal=causal, is_fp8_kvcache=fmt != "bf16")
    kv = cache.dequantize(0)
    if causal:
        ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, 576 ** -0.5)
    else:  # every query sees the whole context
        parts = [reference.dense_mla_decode(q[:, i:i + 1], kv, table, seqlens, 576 ** -0.5)
                 for i in range(2)]
        ro, rl = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
    assert_close(out, ro, name="out")
    assert_close(lse, rl.transpose(1, 2), atol=1e-3, rtol=1e-3, name="lse")


def test_sparse_prefill_flashmla_semantics(device):
    s_q, s_kv, h, topk = 5, 40, 3, 16
    g = torch.Generator().manual_seed(3)
    q = torch.randn(s_q, h, 576, generator=g).bfloat16().to(device)
    kv = torch.randn(s_kv, 1, 576, generator=g).bfloat16().to(device)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=g, dtype=torch.int32)
    idx[0, 0, :4] = -1
    idx[1, 0, 3] = s_kv + 7  # >= s_kv is invalid too
    idx[2, 0] = -1  # lonely
    idx = idx.to(device)
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.05)
    valid = (idx[:, 0] >= 0) & (idx[:, 0] < s_kv)
    clean = torch.where(valid, idx[:, 0], torch.full_like(idx[:, 0], -1))
    ro, rl = reference.sparse_mla(q, kv[:, 0].float(), clean, 0.05)
    assert_close(out, ro, name="out")
    assert_close(lse, rl.masked_fill(rl == float("-inf"), float("inf")), atol=1e-3, rtol=1e-3)
    for t in range(s_q):
        sel = clean[t][clean[t] >= 0].long()
        want = ((q[t].float() @ kv[sel, 0].float().T) * 0.05).amax(-1) if len(sel) else \
            torch.full((h,), float("-inf"), device=device)
        assert_close(max_logits[t], want, atol=1e-3, rtol=1e-3, name="max_logits")


def test_flashmla_bad_input_raises_value_errors(device):
    k_cache = _flashmla_fp8_cache(2, 64, device)
    q = torch.randn(1, 1, 4, 576).bfloat16().to(device)
    idx = torch.zeros(1, 1, 8, dtype=torch.int32, device=device)
    meta, _ = flash_mla.get_mla_metadata()
    with pytest.raises(ValueError, match=r"head_dim_v: must be 512, got 256"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 256, meta, indices=idx,
                                         is_fp8_kvcache=True)
    with pytest.raises(ValueError, match=r"causal: must be False when indices is given"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, causal=True,
                                         indices=idx, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match=r"block_table, cache_seqlens: required"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match=r"k_cache: with is_fp8_kvcache=False expected bfloat16"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, indices=idx)
    with pytest.raises(ValueError, match=r"extra_k_cache: not supported"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, indices=idx,
                                         is_fp8_kvcache=True, extra_k_cache=k_cache)


def test_deep_gemm_paged_and_ragged(device):
    from fp8mla.cache import IndexKeyCache, build_block_table

    page = 16
    cache = IndexKeyCache(4, page, device=device)
    table = build_block_table([[2, 0], [3]], device=device)
    lens = torch.tensor([25, 10], dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(5)
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(n, device=device)
        cache.store(0, torch.randn(n, 128, generator=g).bfloat16().to(device),
                    table[b, pos // page].long() * page + pos % page)
    q = torch.randn(2, 2, 32, 128, generator=g).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(4, 32, generator=g).to(device)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, page, 132)
    logits = deep_gemm.fp8_paged_mqa_logits(q, cache.deep_gemm_view(0), w, lens, table, meta,
                                            32, clean_logits=True)
    keys = cache.dequantize(0)
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(32, device=device)
        kb = keys[table[b, (pos // page).clamp_max(table.shape[1] - 1)].long() * page + pos % page]
        for i in range(2):
            hi = n - 2 + 1 + i
            ref = reference.indexer_logits(q[b, i:i + 1].float(), w[2 * b + i:2 * b + i + 1], kb,
                                           torch.tensor([0]), torch.tensor([hi]))
            assert_close(logits[2 * b + i:2 * b + i + 1], ref, atol=1e-3, rtol=1e-3)
    kbytes, kscales = quantize_index_keys(torch.randn(30, 128, generator=g))
    qr = torch.randn(3, 64, 128, generator=g).to(torch.float8_e4m3fn)
    wr = torch.rand(3, 64, generator=g)
    ks = torch.tensor([0, 4, 9], dtype=torch.int32)
    ke = torch.tensor([30, 4, 20], dtype=torch.int32)
    out = deep_gemm.fp8_mqa_logits(qr.to(device), (kbytes.to(device), kscales.to(device)),
                                   wr.to(device), ks.to(device), ke.to(device), True)
    keys = kbytes.view(torch.float8_e4m3fn).float() * kscales[:, None]
    assert_close(out, reference.indexer_logits(qr.float(), wr, keys, ks, ke), atol=1e-3,
                 rtol=1e-3)


def test_compat_calls_validate_lengths_and_tables_in_check_mode(device):
    """FlashMLA / DeepGEMM trust lengths and block tables (no host sync, graph-capturable): so
    do the compat entry points, unless the diagnosis mode is on (`FP8MLA_CHECK=1`), when a
    length past its table or a page outside the pool is an error naming it."""
    from fp8mla import numerics

    cache, table, seqlens = paged_cache("fp8_ds_mla", [70, 5], 16, device=device, seed=4)
    q = torch.randn(2, 1, 3, 576).bfloat16().to(device)
    too_long = torch.tensor([70, 10**4], dtype=torch.int32, device=device)
    keys, ktable = index_cache([70, 30], 16, device, seed=5)
    q8 = torch.randn(2, 1, 4, 128).to(torch.float8_e4m3fn).to(device)
    bad = ktable.clone()
    bad[0, 0] = 10**6
    lens = torch.tensor([70, 30], dtype=torch.int32, device=device)
    numerics.enable(True)
    try:
        meta, _ = flash_mla.get_mla_metadata()
        with pytest.raises(ValueError, match=r"cache_seqlens: expected lengths in"):
            flash_mla.flash_mla_with_kvcache(q, cache.layer(0).unsqueeze(2), table, too_long,
                                             512, meta, is_fp8_kvcache=True)
        with pytest.raises(ValueError, match=r"block_table: a page within context_lens"):
            deep_gemm.fp8_paged_mqa_logits(q8, keys.deep_gemm_view(0),
                                           torch.rand(2, 4, device=device), lens, bad, None, 80)
    finally:
        numerics.enable(None)


def test_sparse_prefill_errors_name_flashmla_arguments(device):
    q = torch.zeros(2, 3, 576, dtype=torch.bfloat16, device=device)
    kv = torch.zeros(16, 1, 576, dtype=torch.bfloat16, device=device)
    idx = torch.zeros(2, 1, 4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"^sm_scale: "):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, float("nan"))


def test_flashmla_sparse_semantics_hold_in_check_mode(device):
    """In the diagnosis mode the sparse entry points keep FlashMLA's semantics: index entries
    past the pool or past topk_length are skipped, not refused, and a query with nothing to
    attend returns lse +inf without tripping the output check."""
    from fp8mla import numerics

    numerics.enable(True)
    try:
        test_sparse_decode_flashmla_layout(device)
        test_sparse_prefill_flashmla_semantics(device)
    finally:
        numerics.enable(None)


def test_compat_names_arguments_that_are_not_tensors(device):
    cache, table, seqlens = paged_cache("fp8_ds_mla", [20, 9], 16, device=device)
    q = torch.zeros(2, 1, 2, 576, dtype=torch.bfloat16, device=device)
    meta, _ = flash_mla.get_mla_metadata()
    with pytest.raises(TypeError, match="q: expected a torch.Tensor, got list"):
        flash_mla.flash_mla_with_kvcache(q.tolist(), cache.layer(0).unsqueeze(2), table, seqlens,
                                         512, meta, is_fp8_kvcache=True)
    with pytest.raises(TypeError, match="attn_sink: expected a torch.Tensor, got list"):
        flash_mla.flash_mla_with_kvcache(q, cache.layer(0).unsqueeze(2), table, seqlens, 512,
                                         meta, is_fp8_kvcache=True, attn_sink=[0.0, 0.0])
    idx = torch.zeros(2, 1, 4, dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="kv: expected a torch.Tensor, got tuple"):
        flash_mla.flash_mla_sparse_fwd(q[:, 0], (1, 2), idx, 0.04)
    with pytest.raises(ValueError, match="kv: with is_fp8_kvcache=True expected 1-byte"):
        flash_mla.flash_mla_sparse_fwd(q[:, 0], torch.zeros(10, 1, 576, device=device), idx, 0.04)


def test_deep_gemm_names_arguments_of_the_wrong_kind(device):
    with pytest.raises(TypeError, match="context_lens: expected a torch.Tensor, got list"):
        deep_gemm.get_paged_mqa_logits_metadata([1, 2], 64, 132)
    keys = torch.zeros(8, 128, dtype=torch.uint8, device=device)
    q = torch.zeros(2, 4, 128, device=device).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"kv: expected a pair \(keys, scales\), got Tensor"):
        deep_gemm.fp8_mqa_logits(q, keys, torch.rand(2, 4, device=device),
                                 torch.zeros(2, dtype=torch.int32, device=device),
                                 torch.ones(2, dtype=torch.int32, device=device))
