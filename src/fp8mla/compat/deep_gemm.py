"""DeepGEMM's lightning-indexer API (``deep_gemm``), served by fp8mla's kernels on any GPU.

``fp8_paged_mqa_logits`` (decode, paged 132-byte key cache), ``fp8_mqa_logits`` (prefill,
contiguous keys with per-row windows) and ``get_paged_mqa_logits_metadata`` keep DeepGEMM's
arguments and return values. Differences: positions outside a row's window are always −inf
(DeepGEMM leaves them unspecified unless ``clean_logits``); the schedule metadata is an empty
placeholder (fp8mla schedules on the device); any index-head count 1–64 and any power-of-two page
size are served (DeepGEMM on SM90: 32 or 64 heads, page 64).
"""

from __future__ import annotations

import torch

from fp8mla._checks import argument_names, check_tensor
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.numerics import enabled as validating

__all__ = ["get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_mqa_logits"]


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int,
                                  num_sms: int) -> torch.Tensor:
    """A placeholder schedule (int32 [num_sms + 1, 2] zeros on context_lens's device;
    context_lens: int32 [B]): fp8mla needs none."""
    check_tensor("context_lens", context_lens)
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)


def fp8_paged_mqa_logits(
    q_fp8: torch.Tensor, kv_cache_fp8: torch.Tensor, weights: torch.Tensor,
    context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor | None,
    max_context_len: int, clean_logits: bool = True,
) -> torch.Tensor:
    """q_fp8: float8_e4m3fn [B, next_n, H, 128]; kv_cache_fp8: uint8 [num_pages, page_size, 1,
    132] (per page: keys, then scales); weights: float32 [B · next_n, H]; context_lens: int32 [B];
    block_table: int32 [B, max_pages]; schedule_meta: int32 [num_sms + 1, 2] or None, ignored.
    Query i of next_n sees s < context_lens[b] − next_n + 1 + i. Returns float32
    [B · next_n, max_context_len]."""
    with argument_names({"q": "q_fp8", "key_cache": "kv_cache_fp8"}):
        return indexer_logits_paged(q_fp8, weights, kv_cache_fp8, block_table, context_lens,
                                    max_len=max_context_len, check=validating())


def fp8_mqa_logits(
    q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, clean_logits: bool = True,
) -> torch.Tensor:
    """q: float8_e4m3fn [seq_len, H, 128]; kv: (keys uint8 or float8_e4m3fn [seq_len_kv, 128],
    float32 scales [seq_len_kv]); weights: float32 [seq_len, H]; cu_seqlen_ks / cu_seqlen_ke:
    int32 [seq_len], row t's window [ks[t], ke[t]). Returns float32 [seq_len, seq_len_kv]."""
    if not (isinstance(kv, tuple | list) and len(kv) == 2):
        raise TypeError(f"kv: expected a pair (keys, scales), got {type(kv).__name__}")
    keys, scales = kv
    with argument_names({"keys": "kv[0]", "key_scales": "kv[1]", "starts": "cu_seqlen_ks",
                         "ends": "cu_seqlen_ke"}):
        return indexer_logits_ragged(q, weights, keys, scales, cu_seqlen_ks, cu_seqlen_ke,
                                     check=validating())
