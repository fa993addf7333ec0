"""`test_layouts` on the GPU: the same properties where the launchers pick other kernels
(TMA copies, the SM90 Gluon kernels) — each tensor argument in another layout gives bitwise
the contiguous call's result or an error naming it (GPU only; on the CPU the module it imports
runs through the interpreter)."""

import functools

import pytest
import torch

from fp8mla.decode import dense_decode
from fp8mla.indexer import indexer_logits_paged
from fp8mla.sparse import sparse_decode
from helpers import index_cache, paged_cache, sparse_lists, sparse_pool
from test_layouts import (  # noqa: F401  (the CPU module's tests, collected here under gpu)
    _check_views,
    test_dense_decode_any_layout,
    test_dsa_decode_step_any_layout,
    test_engine_entry_points_any_layout,
    test_indexer_any_layout,
    test_sparse_decode_any_layout,
    test_sparse_prefill_any_layout,
    test_topk_any_layout,
)

pytestmark = pytest.mark.gpu


# the same property at shapes that take the SM90 kernels (where the GPU is one): pages of 64
# tokens, ≤ 8 and 128 heads (the Gluon mma8 and 64-row decode kernels), 8-head fp8_ds_mla
# index lists (the sparse mma8 kernel), 64 index heads (the Gluon indexer)

@pytest.mark.parametrize("fmt,heads", [("fp8", 8), ("fp8_ds_mla", 8), ("fp8", 128),
                                       ("fp8_ds_mla", 128)])
def test_dense_decode_any_layout_sm90_shapes(fmt, heads):
    cache, table, seqlens = paged_cache(fmt, [700, 130], 64, device="cuda", seed=19)
    g = torch.Generator().manual_seed(20)
    q = torch.randn(2, 1, heads, 576, generator=g).bfloat16().cuda()
    call = functools.partial(dense_decode, kv_cache=cache.layer(0), kv_format=fmt,
                             fp8_scale=cache.scale(0))
    _check_views(call, dict(q=q, block_table=table, cache_seqlens=seqlens),
                 ("q", "block_table", "cache_seqlens"))


@pytest.mark.parametrize("heads", [8, 64])
def test_sparse_decode_any_layout_sm90_shapes(heads):
    g = torch.Generator().manual_seed(21)
    cache, live = sparse_pool("fp8_ds_mla", None, 16, 64, "cuda", g)
    idx = sparse_lists(live, 4, 256, g).cuda().view(2, 2, 256)
    q = torch.randn(2, 2, heads, 576, generator=g).bfloat16().cuda()
    lengths = torch.tensor([256, 77], dtype=torch.int32, device="cuda")
    call = functools.partial(sparse_decode, kv_cache=cache.layer(0), kv_format="fp8_ds_mla")
    _check_views(call, dict(q=q, indices=idx, topk_length=lengths),
                 ("q", "indices", "topk_length"))


def test_indexer_any_layout_sm90_shapes():
    cache, table = index_cache([700, 130], 64, "cuda", seed=22)
    g = torch.Generator().manual_seed(23)
    q = torch.randn(2, 2, 64, 128, generator=g).to(torch.float8_e4m3fn).cuda()
    w = torch.rand(4, 64, generator=g).cuda()
    lens = torch.tensor([700, 130], dtype=torch.int32, device="cuda")
    call = functools.partial(indexer_logits_paged, key_cache=cache.layer(0), max_len=768)
    _check_views(call, dict(q=q, weights=w, block_table=table, context_lens=lens),
                 ("q", "weights", "block_table", "context_lens"))
