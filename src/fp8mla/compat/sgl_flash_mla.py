"""FlashMLA's earlier, tensor-schedule interface as ``sgl_kernel.flash_mla`` keeps it (SGLang's
NSA and FlashMLA backends call it), served by fp8mla's kernels on any GPU.

``get_mla_metadata`` returns the schedule as two int32 tensors — ``tile_scheduler_metadata``
[num_sm_parts, 8] and ``num_splits`` [batch + 1] — which callers slice, copy into their CUDA-graph
buffers and pass back; fp8mla plans on its own (per problem shape, `fp8mla._plans.PlanCache`)
and neither fills nor reads them (zeros). ``flash_mla_with_kvcache`` takes them, or the current
interface's `FlashMLASchedMeta` (`fp8mla.compat.flash_mla`), and serves its FP8 path (e4m3 q
and 576-byte e4m3 rows with their descale factors, which sgl_kernel has disabled);
``flash_mla_sparse_fwd`` is the current interface's (its lse natural-log, as FlashMLA's reference
computes it; sgl_kernel's docstring says base 2).
"""

from __future__ import annotations

import torch
import triton

from fp8mla._checks import check_int, check_tensor
from fp8mla.compat import flash_mla as _current
from fp8mla.compat.flash_mla import FlashMLASchedMeta, flash_mla_sparse_fwd
from fp8mla.runtime import target_for

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache",
           "flash_mla_sparse_fwd"]

SCHEDULE_WORDS = 8  # FlashMLA's TileSchedulerMetaDataSize
_BLOCK_M = 64  # query rows of a FlashMLA program: the schedule's parts per SM follow from it


def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                     num_heads_k: int = 1, num_heads_q: int | None = None,
                     is_fp8_kvcache: bool = False,
                     topk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cache_seqlens: int32 [batch]; num_q_tokens_per_head_k: s_q · h_q / h_k. Returns
    (tile_scheduler_metadata int32 [num_sm_parts, 8], num_splits int32 [batch + 1]) on
    cache_seqlens's device, zeros, shaped as FlashMLA's (num_sm_parts = SMs / h_k /
    ⌈rows / 64⌉) so callers' buffers and slices fit."""
    check_tensor("cache_seqlens", cache_seqlens, ndim=1)
    rows = check_int("num_q_tokens_per_head_k", num_q_tokens_per_head_k, lo=1)
    heads_k = check_int("num_heads_k", num_heads_k, lo=1)
    parts = max(1, target_for(cache_seqlens.device).num_sms // heads_k
                // triton.cdiv(rows, _BLOCK_M))
    device = cache_seqlens.device
    return (torch.zeros(parts, SCHEDULE_WORDS, dtype=torch.int32, device=device),
            torch.zeros(cache_seqlens.shape[0] + 1, dtype=torch.int32, device=device))


def flash_mla_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None, head_dim_v: int,
    tile_scheduler_metadata: torch.Tensor | FlashMLASchedMeta,
    num_splits: torch.Tensor | None = None, softmax_scale: float | None = None,
    causal: bool = False, descale_q: torch.Tensor | None = None,
    descale_k: torch.Tensor | None = None, is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8mla.compat.flash_mla.flash_mla_with_kvcache` under sgl_kernel's signature, with its
    FP8 dense path (SGLang's FlashMLA backend over an FP8 pool; disabled in sgl_kernel today):
    q float8_e4m3fn [b, s_q, h_q, 576] with descale_q float32 [1] or [b] (q's dequantization:
    q · descale_q, rounded once to bf16), over 576-byte e4m3 rows [num_blocks, page, 1, 576]
    whose one scale is descale_k (float32 [1]; the pool read directly, ``is_fp8_kvcache``
    implied). descale_q / descale_k come together or not at all, as sgl_kernel asks; with bf16
    q they are not read (sgl_kernel's bf16 path does not read them). Returns (out bfloat16
    [b, s_q, h_q, 512], lse float32 [b, h_q, s_q])."""
    if (descale_q is None) != (descale_k is None):
        raise ValueError("descale_q, descale_k: expected both or neither")
    fp8_scale = None
    if isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn:
        if indices is not None:
            raise ValueError("q: float8_e4m3fn q serves dense decode only (sgl_kernel's FP8 "
                             "path); sparse attention takes bfloat16 q")
        check_tensor("q", q, ndim=4)
        if descale_q is not None:
            check_tensor("descale_q", descale_q, dtype=torch.float32, device=q.device)
            check_tensor("descale_k", descale_k, dtype=torch.float32, shape=(1,),
                         device=q.device)
            if descale_q.numel() not in (1, q.shape[0]):
                raise ValueError(f"descale_q: expected float32 [1] or [{q.shape[0]}], got "
                                 f"{list(descale_q.shape)}")
            q = (q.float() * descale_q.reshape(-1, 1, 1, 1)).bfloat16()
            fp8_scale = descale_k
        else:
            q = q.bfloat16()
        is_fp8_kvcache = True
    return _current._with_kvcache(
        q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
        num_splits, softmax_scale, causal, is_fp8_kvcache, indices, fp8_scale=fp8_scale)
