"""Every tensor argument of the public kernels' entry points, given as a view of another layout
holding the same values — every other element of a larger tensor, a transposed copy seen back
in the original order, a start past the first element of a buffer — either gives bitwise the
result of the contiguous call or is refused with a ValueError naming that argument. Never a
silently different result (session 44 found lengths, windows, scales and q read as
contiguous when they were not — in the DSA layer's own MTP step among others)."""

import functools

import pytest
import torch

from fp8mla.decode import dense_decode
from fp8mla.formats import quantize_index_keys
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.sparse import sparse_decode
from fp8mla.topk import topk_indices
from helpers import index_cache, paged_cache, sparse_lists, sparse_pool


def _spaced(t):
    """The same values, every other element along the last dimension of a tensor twice as
    long (stride 2 there)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def _transposed(t):
    """The same values, stored with the last two dimensions swapped (column-major rows)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _offset(t):
    """The same values, contiguous, starting 16 elements into a larger buffer."""
    buf = torch.zeros(t.numel() + 16, dtype=t.dtype, device=t.device)
    buf[16:].copy_(t.reshape(-1))
    return buf[16:].view(t.shape)


VIEWS = {"spaced": _spaced, "transposed": _transposed, "offset": _offset}


def _same(a, b):
    """Bitwise equal outputs (tensors or tuples of them), NaN where NaN."""
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(
        a.isnan(), b.isnan())


def _check_views(call, args, names):
    """call(**args) against call(**args with args[name] re-laid-out) for each name and view;
    an offset view (contiguous, aligned) must be accepted."""
    want = call(**args)
    for name in names:
        for label, view in VIEWS.items():
            t = args[name]
            if label == "transposed" and t.dim() < 2:
                continue
            try:
                got = call(**{**args, name: view(t)})
            except ValueError as e:
                assert label != "offset", f"{name} {label}: refused: {e}"
                assert str(e).startswith(f"{name}:"), f"{name} {label}: {e}"
                continue
            assert _same(got, want), f"{name} given {label}: a different result, no error"


def _decode_problem(device):
    cache, table, seqlens = paged_cache("fp8", [37, 70], 16, device=device, seed=7)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 2, 3, 576, generator=g).bfloat16().to(device)
    return cache, table, seqlens, q


def test_dense_decode_any_layout(device):
    cache, table, seqlens, q = _decode_problem(device)
    call = functools.partial(dense_decode, kv_cache=cache.layer(0), kv_format="fp8")
    _check_views(call, dict(q=q, block_table=table, cache_seqlens=seqlens,
                            fp8_scale=cache.scale(0).reshape(1)),
                 ("q", "block_table", "cache_seqlens", "fp8_scale"))


def test_sparse_decode_any_layout(device):
    g = torch.Generator().manual_seed(9)
    cache, live = sparse_pool("fp8_ds_mla", None, 8, 16, device, g)
    idx = sparse_lists(live, 4, 24, g).to(device).view(2, 2, 24)
    q = torch.randn(2, 2, 3, 576, generator=g).bfloat16().to(device)
    lengths = torch.tensor([24, 9], dtype=torch.int32, device=device)
    call = functools.partial(sparse_decode, kv_cache=cache.layer(0), kv_format="fp8_ds_mla")
    _check_views(call, dict(q=q, indices=idx, topk_length=lengths),
                 ("q", "indices", "topk_length"))


def test_sparse_prefill_any_layout(device):
    from fp8mla.sparse import sparse_prefill

    g = torch.Generator().manual_seed(18)
    cache, live = sparse_pool("fp8", None, 8, 16, device, g)
    idx = sparse_lists(live, 3, 24, g).to(device)
    q = torch.randn(3, 2, 576, generator=g).bfloat16().to(device)
    lengths = torch.tensor([24, 9, 0], dtype=torch.int32, device=device)
    call = functools.partial(sparse_prefill, kv_format="fp8", fp8_scale=cache.scale(0))
    _check_views(call, dict(q=q, kv_cache=cache.layer(0), indices=idx, topk_length=lengths),
                 ("q", "kv_cache", "indices", "topk_length"))


def test_indexer_any_layout(device):
    cache, table = index_cache([70, 30], 16, device, seed=10)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 2, 4, 128, generator=g).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(4, 4, generator=g).to(device)
    lens = torch.tensor([70, 30], dtype=torch.int32, device=device)
    call = functools.partial(indexer_logits_paged, key_cache=cache.layer(0), max_len=80)
    _check_views(call, dict(q=q, weights=w, block_table=table, context_lens=lens),
                 ("q", "weights", "block_table", "context_lens"))
    kb, ks = quantize_index_keys(torch.randn(40, 128, generator=g))
    q = torch.randn(3, 4, 128, generator=g).bfloat16().to(device)
    w = torch.rand(3, 4, generator=g).to(device)
    starts = torch.tensor([0, 5, 10], dtype=torch.int32, device=device)
    ends = torch.tensor([40, 20, 10], dtype=torch.int32, device=device)
    _check_views(indexer_logits_ragged,
                 dict(q=q, weights=w, keys=kb.to(device), key_scales=ks.to(device),
                      starts=starts, ends=ends),
                 ("q", "weights", "keys", "key_scales", "starts", "ends"))


def test_topk_any_layout(device):
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(4, 300, generator=g).to(device)
    lengths = torch.tensor([300, 100, 5, 0], dtype=torch.int32, device=device)
    table = torch.randint(0, 50, (2, 19), generator=g, dtype=torch.int32).to(device)
    call = functools.partial(topk_indices, k=16, page_size=16, rows_per_request=2)
    _check_views(call, dict(logits=logits, lengths=lengths, block_table=table),
                 ("logits", "lengths", "block_table"))


def test_wrapper_errors_keep_their_type_and_traceback():
    """`argument_names` renames in place: a subclass stays itself, the raising frame stays in
    the traceback, and a name inside a head ("index heads (q.shape[-2])") is renamed too."""
    import traceback

    from fp8mla._checks import argument_names

    class Refused(ValueError):
        def __init__(self, message, code):
            super().__init__(message)
            self.code = code

    def inner():
        raise Refused("q: bad", 7)

    with pytest.raises(Refused) as info, argument_names({"q": "q_index"}):
        inner()
    assert str(info.value) == "q_index: bad" and info.value.code == 7
    assert "inner" in "".join(traceback.format_tb(info.value.__traceback__))
    with pytest.raises(ValueError, match=r"^index heads \(q_fp8\.shape\[-2\]\): expected"):
        with argument_names({"q": "q_fp8"}):
            raise ValueError("index heads (q.shape[-2]): expected an int in [1, 64], got 65")


def test_the_property_catches_a_layout_misread():
    """`_check_views` fails a call that reads its argument as if contiguous."""
    def misreads(x):  # x's storage taken as a contiguous tensor of x's shape
        return x.as_strided(x.shape, x.contiguous().stride()).clone()

    with pytest.raises(AssertionError, match="x given spaced: a different result"):
        _check_views(misreads, dict(x=torch.arange(12.0).view(3, 4)), ("x",))


def test_dsa_decode_step_any_layout(device):
    from fp8mla.cache import IndexKeyCache
    from fp8mla.dsa import dsa_decode_step

    kv, table, seqlens = paged_cache("fp8_ds_mla", [40, 21], 16, device=device, seed=13)
    index_cache = IndexKeyCache(kv.num_pages, 16, device=device)
    g = torch.Generator().manual_seed(14)
    for b, n in enumerate([40, 21]):
        pos = torch.arange(n, device=device)
        index_cache.store(0, torch.randn(n, 128, generator=g).bfloat16().to(device),
                          table[b, pos // 16].long() * 16 + pos % 16)
    q = torch.randn(2, 2, 3, 576, generator=g).bfloat16().to(device)
    q_index = torch.randn(2, 2, 4, 128, generator=g).to(torch.float8_e4m3fn).to(device)
    w = torch.rand(4, 4, generator=g).to(device)
    call = functools.partial(dsa_decode_step, kv_cache=kv.layer(0),
                             index_cache=index_cache.layer(0), kv_format="fp8_ds_mla", topk=8)
    _check_views(call, dict(q=q, q_index=q_index, index_weights=w, block_table=table,
                            cache_seqlens=seqlens),
                 ("q", "q_index", "index_weights", "block_table", "cache_seqlens"))


def test_engine_entry_points_any_layout(device):
    """The FlashMLA- and DeepGEMM-shaped entry points engines call (`fp8mla.compat`)."""
    from fp8mla.compat import deep_gemm, flash_mla

    cache, table, seqlens = paged_cache("fp8_ds_mla", [70, 5], 16, device=device, seed=15)
    g = torch.Generator().manual_seed(16)

    def dense(q, block_table, cache_seqlens):  # a fresh schedule a call: plans are per shape
        meta, _ = flash_mla.get_mla_metadata()
        return flash_mla.flash_mla_with_kvcache(q, cache.layer(0).unsqueeze(2), block_table,
                                                cache_seqlens, 512, meta, causal=True,
                                                is_fp8_kvcache=True)

    q = torch.randn(2, 2, 3, 576, generator=g).bfloat16().to(device)
    _check_views(dense, dict(q=q, block_table=table, cache_seqlens=seqlens),
                 ("q", "block_table", "cache_seqlens"))
    keys, ktable = index_cache([70, 30], 16, device, seed=17)
    q8 = torch.randn(2, 1, 4, 128, generator=g).to(torch.float8_e4m3fn).to(device)
    lens = torch.tensor([70, 30], dtype=torch.int32, device=device)
    call = functools.partial(deep_gemm.fp8_paged_mqa_logits, kv_cache=keys.deep_gemm_view(0),
                             schedule_meta=None, max_context_len=80)
    _check_views(call, dict(q=q8, weights=torch.rand(2, 4, generator=g).to(device),
                            context_lens=lens, block_table=ktable),
                 ("q", "weights", "context_lens", "block_table"))
