"""DeepGEMM's lightning-indexer API (``deep_gemm``), served by fp8mla's kernels on any GPU.

``fp8_paged_mqa_logits`` (decode, paged 132-byte key cache), ``fp8_mqa_logits`` (prefill,
contiguous keys with per-row windows), their ``fp8_fp4_*`` forms (q as a pair with its MX
scales, FP8 only here: the scales None), ``get_paged_mqa_logits_metadata`` and
``get_num_sms`` / ``set_num_sms`` keep DeepGEMM's argument names, defaults and return values.
Differences: positions outside a row's window are always −inf (DeepGEMM leaves them unspecified
unless ``clean_logits``); the schedule metadata is an empty placeholder (fp8mla schedules on the
device); any index-head count 1–64, any power-of-two page size and any ``next_n`` are served
(DeepGEMM on SM90: 32 or 64 heads, pages of 32 or 64); the logits come back exactly as wide as
asked (DeepGEMM's rows are strided to 1024 bytes); ``indices`` (DeepGEMM's variable-length
batches) is not supported.
"""

from __future__ import annotations

import torch

from fp8mla._checks import argument_names, check_int, check_tensor
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.numerics import enabled as validating

__all__ = ["get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_mqa_logits",
           "fp8_fp4_paged_mqa_logits", "fp8_fp4_mqa_logits", "get_num_sms", "set_num_sms"]

# gathered windows (``max_seqlen_k``) are taken a bounded number of rows at a time: at most
# this many bytes of full logits, indices and gathered values together
CHUNK_BYTES = 1 << 28
_LOGITS_DTYPES = (torch.float32, torch.bfloat16)
_num_sms: int | None = None


def get_num_sms() -> int:
    """The SM count DeepGEMM schedules for: `set_num_sms`'s, else the current GPU's (fp8mla's
    kernels size their own grids; this only answers callers that ask)."""
    if _num_sms is not None:
        return _num_sms
    if not torch.cuda.is_available():
        raise RuntimeError("get_num_sms: no CUDA GPU here, and set_num_sms was not called")
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def set_num_sms(num_sms: int) -> None:
    """Record ``num_sms`` for `get_num_sms` (fp8mla's kernels do not read it)."""
    global _num_sms
    _num_sms = check_int("num_sms", num_sms, lo=1)


def _no_indices(indices: object) -> None:
    if indices is not None:
        raise ValueError("indices: DeepGEMM's variable-length batches are not supported by "
                         "fp8mla (pass None)")


def _q_fp8(q: object) -> torch.Tensor:
    """The FP8 values of an ``fp8_fp4_*`` call's q pair (values, MX scales or None)."""
    if not (isinstance(q, tuple | list) and len(q) == 2):
        raise TypeError(f"q: expected a pair (values, scales or None), got {type(q).__name__}")
    if q[1] is not None:
        raise ValueError("q: FP4 queries with MX scales (q[1]) are not supported by fp8mla; "
                         "pass (float8_e4m3fn values, None)")
    return q[0]


def _check_logits_dtype(logits_dtype: object) -> None:
    if logits_dtype not in _LOGITS_DTYPES:
        raise ValueError(f"logits_dtype: expected torch.float32 or torch.bfloat16, got "
                         f"{logits_dtype}")


def _as(logits: torch.Tensor, logits_dtype: torch.dtype) -> torch.Tensor:
    """The float32 logits in the checked ``logits_dtype`` (`_check_logits_dtype`)."""
    return logits if logits_dtype == torch.float32 else logits.to(logits_dtype)


def _per_query_lens(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """``context_lens`` as `indexer_logits_paged` takes them: int32 [B, next_n], each query's
    own length, contiguous (2-D lengths, or next_n above its causal form's 4), or [B] (query i
    sees its request's length − next_n + 1 + i)."""
    if context_lens.dim() == 2:  # ([B, 1] may be a column of a wider buffer)
        return (context_lens.reshape(-1) if context_lens.shape[1] == 1
                else context_lens).contiguous()
    if next_n <= 4:
        return context_lens.contiguous()
    steps = torch.arange(1 - next_n, 1, dtype=torch.int32, device=context_lens.device)
    return (context_lens[:, None] + steps).clamp_min(0)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """A placeholder schedule (int32 [num_sms + 1, 2] zeros on context_lens's device;
    context_lens: int32 [B] or [B, next_n]): fp8mla needs none."""
    check_tensor("context_lens", context_lens)
    _no_indices(indices)
    num_sms = check_int("num_sms", num_sms, lo=1)
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None], kv_cache: torch.Tensor, weights: torch.Tensor,
    context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor | None,
    max_context_len: int, clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: (float8_e4m3fn [B, next_n, H, 128], None); kv_cache: uint8 [num_pages, page_size, 1,
    132] (per page: keys, then scales); weights: float32 [B · next_n, H]; context_lens: int32
    [B, next_n] (query i's own length) or [B] (query i of next_n sees s < context_lens[b] −
    next_n + 1 + i); block_table: int32 [B, max_pages]; schedule_meta: int32 [num_sms + 1, 2]
    or None, ignored. Returns logits_dtype (float32 or bfloat16) [B · next_n,
    max_context_len]."""
    _no_indices(indices)
    _check_logits_dtype(logits_dtype)
    q = _q_fp8(q)
    check_tensor("q", q, ndim=4)
    check_tensor("context_lens", context_lens, dtype=torch.int32)
    b, next_n = q.shape[0], q.shape[1]
    if context_lens.dim() not in (1, 2) or context_lens.shape[0] != b or (
            context_lens.dim() == 2 and context_lens.shape[1] != next_n):
        raise ValueError(f"context_lens: expected int32 [{b}, {next_n}] or [{b}], got "
                         f"{list(context_lens.shape)}")
    lens = _per_query_lens(context_lens, next_n)
    with argument_names({"key_cache": "kv_cache", "max_len": "max_context_len"}):
        logits = indexer_logits_paged(q, weights, kv_cache, block_table, lens,
                                      max_len=max_context_len, check=validating())
    return _as(logits, logits_dtype)


def fp8_paged_mqa_logits(
    q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
    block_table: torch.Tensor, schedule_meta: torch.Tensor | None, max_context_len: int,
    clean_logits: bool = False, indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fp8_fp4_paged_mqa_logits` with q the float8_e4m3fn tensor itself; float32 logits."""
    return fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table,
                                    schedule_meta, max_context_len, clean_logits,
                                    indices=indices)


def _windows(logits_of, starts: torch.Tensor, ends: torch.Tensor, seq_kv: int,
             width: int) -> torch.Tensor:
    """float32 [rows, width]: row t's logits from key starts[t] on (−inf past ends[t] and past
    the keys), from ``logits_of(r0, r1)`` (rows r0..r1 over all seq_kv keys) a chunk of rows
    at a time: 4 · seq_kv + 13 · width bytes a row (logits, int64 indices, mask) within
    `CHUNK_BYTES`."""
    rows = starts.shape[0]
    out = torch.empty(rows, width, dtype=torch.float32, device=starts.device)
    step = max(1, CHUNK_BYTES // (4 * seq_kv + 13 * width))
    cols = torch.arange(width, dtype=torch.int64, device=starts.device)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        at = starts[r0:r1, None].long() + cols
        outside = (at >= ends[r0:r1, None].long()) | (at >= seq_kv)
        if seq_kv:  # (clamped: never an index outside the row, whatever the windows say)
            torch.gather(logits_of(r0, r1), 1, at.clamp_(0, seq_kv - 1), out=out[r0:r1])
        out[r0:r1].masked_fill_(outside, float("-inf"))
    return out


def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None], kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True, max_seqlen_k: int = 0, logits_dtype: torch.dtype = torch.float32,
    schedule_meta: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: (float8_e4m3fn [seq_len, H, 128], None); kv: (keys uint8 or float8_e4m3fn
    [seq_len_kv, 128], float32 scales [seq_len_kv]); weights: float32 [seq_len, H];
    cu_seq_len_k_start / cu_seq_len_k_end: int32 [seq_len], row t's window [start[t], end[t]).
    Returns logits_dtype (float32 or bfloat16) [seq_len, seq_len_kv]; with max_seqlen_k > 0,
    [seq_len, max_seqlen_k] with column j row t's key start[t] + j (−inf past its window).
    schedule_meta: ignored."""
    q = _q_fp8(q)
    if not (isinstance(kv, tuple | list) and len(kv) == 2):
        raise TypeError(f"kv: expected a pair (keys, scales), got {type(kv).__name__}")
    width = check_int("max_seqlen_k", max_seqlen_k, lo=0)
    _check_logits_dtype(logits_dtype)
    keys, scales = kv
    starts, ends = cu_seq_len_k_start, cu_seq_len_k_end
    check_tensor("q", q, ndim=3)  # the per-row arguments in full, before any chunk of rows
    rows = q.shape[0]
    check_tensor("weights", weights, shape=(rows, None))
    check_tensor("cu_seq_len_k_start", starts, dtype=torch.int32, shape=(rows,))
    check_tensor("cu_seq_len_k_end", ends, dtype=torch.int32, shape=(rows,))
    names = {"keys": "kv[0]", "key_scales": "kv[1]", "starts": "cu_seq_len_k_start",
             "ends": "cu_seq_len_k_end"}

    def logits_of(r0: int | None = None, r1: int | None = None) -> torch.Tensor:
        with argument_names(names):
            return indexer_logits_ragged(q[r0:r1], weights[r0:r1], keys, scales, starts[r0:r1],
                                         ends[r0:r1], check=validating())

    if not width:
        return _as(logits_of(), logits_dtype)
    return _as(_windows(logits_of, starts, ends, keys.shape[0], width), logits_dtype)


def fp8_mqa_logits(
    q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True, max_seqlen_k: int = 0,
) -> torch.Tensor:
    """`fp8_fp4_mqa_logits` with q the float8_e4m3fn tensor itself; float32 logits."""
    return fp8_fp4_mqa_logits((q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                              clean_logits, max_seqlen_k)
