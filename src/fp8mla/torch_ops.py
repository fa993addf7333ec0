"""fp8mla's kernels as torch custom ops (``torch.ops.fp8mla.*``), with fake (meta)
implementations, so they trace under ``torch.compile`` and record into CUDA graphs as single
opaque nodes (``dense_prefill`` builds its plans per call: trace it, do not capture it).
Importing this module registers them: ``dense_decode``, ``dense_prefill``, ``sparse_attention``,
``indexer_logits``, ``topk_indices`` — ``help()`` on each ``*_op`` gives its tensors' shapes and
dtypes (set at the end of this file).

The Python functions they wrap (fp8mla.decode.dense_decode,
fp8mla.prefill.dense_prefill_ragged, fp8mla.sparse.sparse_prefill,
fp8mla.indexer.indexer_logits_paged, fp8mla.topk.topk_indices) say more; the ops skip the
host-side validation (``check=False``): validate once outside the hot path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8mla.decode import dense_decode
from fp8mla.formats import LATENT_DIM
from fp8mla.indexer import indexer_logits_paged
from fp8mla.prefill import dense_prefill_ragged
from fp8mla.sparse import sparse_prefill
from fp8mla.topk import topk_indices

__all__ = ["dense_decode_op", "dense_prefill_op", "sparse_attention_op", "indexer_logits_op",
           "topk_indices_op"]


@torch.library.custom_op("fp8mla::dense_decode", mutates_args=())
def dense_decode_op(q: Tensor, kv_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                    kv_format: str, softmax_scale: float,
                    fp8_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    out, lse = dense_decode(q, kv_cache, block_table, cache_seqlens, kv_format=kv_format,
                            softmax_scale=softmax_scale, fp8_scale=fp8_scale, check=False)
    return out.clone(), lse.clone()


@dense_decode_op.register_fake
def _(q, kv_cache, block_table, cache_seqlens, kv_format, softmax_scale, fp8_scale):
    b, s_q, h, _ = q.shape
    return (q.new_empty(b, s_q, h, LATENT_DIM),
            q.new_empty(b, s_q, h, dtype=torch.float32))


@torch.library.custom_op("fp8mla::dense_prefill", mutates_args=())
def dense_prefill_op(q: Tensor, cu_seqlens_q: Tensor, kv_cache: Tensor, block_table: Tensor,
                     cache_seqlens: Tensor, kv_format: str, softmax_scale: float,
                     fp8_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    out, lse = dense_prefill_ragged(q, cu_seqlens_q, kv_cache, block_table, cache_seqlens,
                                    kv_format=kv_format, softmax_scale=softmax_scale,
                                    fp8_scale=fp8_scale, check=False)
    return out.clone(), lse.clone()


@dense_prefill_op.register_fake
def _(q, cu_seqlens_q, kv_cache, block_table, cache_seqlens, kv_format, softmax_scale,
      fp8_scale):
    t, h, _ = q.shape
    return q.new_empty(t, h, LATENT_DIM), q.new_empty(t, h, dtype=torch.float32)


@torch.library.custom_op("fp8mla::sparse_attention", mutates_args=())
def sparse_attention_op(q: Tensor, kv_cache: Tensor, indices: Tensor, topk_length: Tensor | None,
                        kv_format: str, softmax_scale: float,
                        fp8_scale: Tensor | None) -> tuple[Tensor, Tensor]:
    out, lse = sparse_prefill(q, kv_cache, indices, kv_format=kv_format,
                              topk_length=topk_length, softmax_scale=softmax_scale,
                              fp8_scale=fp8_scale, check=False)
    return out.clone(), lse.clone()


@sparse_attention_op.register_fake
def _(q, kv_cache, indices, topk_length, kv_format, softmax_scale, fp8_scale):
    t, h, _ = q.shape
    return q.new_empty(t, h, LATENT_DIM), q.new_empty(t, h, dtype=torch.float32)


@torch.library.custom_op("fp8mla::indexer_logits", mutates_args=())
def indexer_logits_op(q: Tensor, weights: Tensor, key_cache: Tensor, block_table: Tensor,
                      context_lens: Tensor, max_len: int) -> Tensor:
    return indexer_logits_paged(q, weights, key_cache, block_table, context_lens,
                                max_len=max_len, check=False)


@indexer_logits_op.register_fake
def _(q, weights, key_cache, block_table, context_lens, max_len):
    return weights.new_empty(q.shape[0] * q.shape[1], max_len)


@torch.library.custom_op("fp8mla::topk_indices", mutates_args=())
def topk_indices_op(logits: Tensor, k: int, lengths: Tensor | None) -> Tensor:
    return topk_indices(logits, k, lengths=lengths)


@topk_indices_op.register_fake
def _(logits, k, lengths):
    return logits.new_empty(logits.shape[0], k, dtype=torch.int32)


# help(op) shows these (torch's CustomOpDef has no docstring of the function it wraps)
dense_decode_op.__doc__ = """torch.ops.fp8mla.dense_decode(q, kv_cache, block_table, cache_seqlens,
kv_format, softmax_scale, fp8_scale) -> (out, lse): `fp8mla.decode.dense_decode` without its
host checks. q bf16 [batch, s_q, heads, 576]; kv_cache uint8 [num_pages, page_size, row_bytes];
block_table int32 [batch, max_pages]; cache_seqlens int32 [batch]; fp8_scale float32 [1] or
None → out bf16 [batch, s_q, heads, 512], lse float32 [batch, s_q, heads]."""
dense_prefill_op.__doc__ = """torch.ops.fp8mla.dense_prefill(q, cu_seqlens_q, kv_cache, block_table,
cache_seqlens, kv_format, softmax_scale, fp8_scale) -> (out, lse):
`fp8mla.prefill.dense_prefill_ragged` without its host checks (causal prefill of a packed batch).
q bf16 [tokens, heads, 576]; cu_seqlens_q int32 [batch + 1]; kv_cache uint8 [num_pages,
page_size, row_bytes]; block_table int32 [batch, max_pages]; cache_seqlens int32 [batch] (with
the new tokens); fp8_scale float32 [1] or None → out bf16 [tokens, heads, 512], lse float32
[tokens, heads]."""
sparse_attention_op.__doc__ = """torch.ops.fp8mla.sparse_attention(q, kv_cache, indices, topk_length,
kv_format, softmax_scale, fp8_scale) -> (out, lse): `fp8mla.sparse.sparse_prefill` without its
host checks. q bf16 [tokens, heads, 576]; kv_cache uint8 [num_pages, page_size, row_bytes] or
[num_slots, row_bytes]; indices int32 [tokens, topk] (−1 skips); topk_length int32 [tokens] or
None → out bf16 [tokens, heads, 512], lse float32 [tokens, heads]."""
indexer_logits_op.__doc__ = """torch.ops.fp8mla.indexer_logits(q, weights, key_cache, block_table,
context_lens, max_len) -> logits: `fp8mla.indexer.indexer_logits_paged` without its host
checks. q float8_e4m3fn / bf16 / fp16 [batch, s_q, index_heads, 128]; weights float32
[batch · s_q, index_heads]; key_cache uint8 [num_pages, page_size · 132]; block_table int32
[batch, max_pages]; context_lens int32 [batch] or [batch, s_q] → float32 [batch · s_q,
max_len]."""
topk_indices_op.__doc__ = """torch.ops.fp8mla.topk_indices(logits, k, lengths) -> indices:
`fp8mla.topk.topk_indices`. logits float32 [rows, length]; lengths int32 [rows] or None →
int32 [rows, k], positions in ascending order, −1 padded."""
