"""One DeepSeek-Sparse-Attention decode step: indexer → top-k → sparse MLA, FP8 throughout.

The latent cache and the index-key cache share one block table (as in SGLang and vLLM), so both
have the same page size. Each step reads the index keys of the whole context, picks ``topk``
slots per query and attends over those rows only.
"""

from __future__ import annotations

import torch

from fp8mla._checks import argument_names, check_tensor
from fp8mla.decode import check_paged_inputs
from fp8mla.formats import KVFormat
from fp8mla.indexer import indexer_logits_paged
from fp8mla.sparse import sparse_decode
from fp8mla.topk import topk_indices

__all__ = ["dsa_decode_step"]


# the indexer's arguments as `dsa_decode_step` names them
INDEXER_NAMES = {"q": "q_index", "weights": "index_weights", "key_cache": "index_cache",
                 "context_lens": "cache_seqlens"}


def dsa_decode_step(
    q: torch.Tensor, q_index: torch.Tensor, index_weights: torch.Tensor,
    kv_cache: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor,
    cache_seqlens: torch.Tensor, *, kv_format: str | KVFormat, topk: int,
    softmax_scale: float | None = None, fp8_scale: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse decode for ``batch`` requests with ``s_q`` new tokens each.

    q: [batch, s_q, heads, 576] bfloat16; q_index: [batch, s_q, index_heads, 128]
    float8_e4m3fn (or bf16); index_weights: float32 [batch · s_q, index_heads] (q_index's
    per-token scale folded in); kv_cache: latent pool of one layer, uint8
    [num_pages, page_size, row_bytes]; index_cache: `IndexKeyCache.layer(i)`, uint8
    [num_pages, page_size · 132]; block_table: int32 [batch, max_pages]; cache_seqlens: int32
    [batch] (the new tokens included); fp8_scale: float32 [1], the ``fp8`` format's
    per-tensor scale (others ignore it). Query i sees tokens s < cache_seqlens − s_q + 1 + i.
    Returns (out bfloat16 [batch, s_q, heads, 512], lse float32 [batch, s_q, heads], the chosen
    slots int32 [batch, s_q, topk], −1 padded).
    """
    check_tensor("q", q, dtype=torch.bfloat16, ndim=4)
    check_tensor("kv_cache", kv_cache, ndim=3)
    b, s_q = q.shape[0], q.shape[1]
    # q_index against q's batch and s_q (the indexer takes them from q_index itself)
    check_tensor("q_index", q_index, ndim=4, shape=(b, s_q, None, None))
    check_tensor("index_cache", index_cache)
    page_size = kv_cache.shape[1]
    # the latent pool's pages too (the indexer validates the index cache's): a page within the
    # lengths that only the index cache holds would be attended outside the latent pool
    check_paged_inputs(block_table, cache_seqlens, b, page_size, kv_cache.shape[0], q.device,
                       validate=check)
    if index_cache.shape[-1] != page_size * 132 and tuple(index_cache.shape[1:]) != (page_size, 1, 132):
        raise ValueError(f"index_cache: expected pages of {page_size} keys (the latent cache's "
                         f"page size), got shape {list(index_cache.shape)}")
    max_len = block_table.shape[1] * page_size
    with argument_names(INDEXER_NAMES):
        logits = indexer_logits_paged(q_index, index_weights, index_cache, block_table,
                                      cache_seqlens, max_len=max_len, check=check)
    i = torch.arange(s_q, device=q.device, dtype=torch.int32)
    visible = (cache_seqlens[:, None] - s_q + 1 + i[None, :]).clamp_min(0).reshape(-1)
    with argument_names({"k": "topk"}):
        slots = topk_indices(logits, topk, lengths=visible, block_table=block_table,
                             page_size=page_size, rows_per_request=s_q)
    out, lse = sparse_decode(q, kv_cache, slots.view(b, s_q, topk), kv_format=kv_format,
                             softmax_scale=softmax_scale, fp8_scale=fp8_scale, check=check)
    return out, lse, slots.view(b, s_q, topk)
