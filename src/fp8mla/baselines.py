"""Baselines for measurement, selectable by name in `fp8mla.decode.dense_decode`:

``full_cast``   cast the whole FP8 pool to BF16, then BF16 attention — what the GLM-5 server that
                motivated fp8mla did every layer of every step (docs/DESIGN.md §1).
``gather_cast`` gather the pages the batch's block table names, cast those, attend — that
                server's "Option B".
``reference``   the float32 PyTorch oracle (fp8mla.reference) on the dequantized pool.

The casts are plain PyTorch ops; the attention after them is fp8mla's own BF16 kernel, so the
difference from the native path is the cast alone.
"""

from __future__ import annotations

import torch

from fp8mla import reference
from fp8mla._checks import check_int, check_tensor
from fp8mla.formats import LATENT_DIM, KVFormat, dequantize_kv

__all__ = ["BASELINES", "cast_rows_to_bf16", "dense_decode"]

BASELINES = ("full_cast", "gather_cast", "reference")


def cast_rows_to_bf16(rows: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """uint8 [..., row_bytes] → bf16 [..., 576] with one elementwise pass per part. The ``fp8``
    format's per-tensor scale is not applied (the BF16 kernel folds it in)."""
    if fmt.name == "bf16":
        return rows.view(torch.bfloat16)
    if fmt.name == "fp8":
        return rows.view(torch.float8_e4m3fn).to(torch.bfloat16)
    lead = rows.shape[:-1]
    lat = rows[..., :LATENT_DIM].view(torch.float8_e4m3fn).to(torch.bfloat16)
    scales = rows[..., LATENT_DIM:LATENT_DIM + 16].contiguous().view(torch.float32)
    lat = (lat.view(*lead, 4, 128) * scales[..., None].to(torch.bfloat16)).view(*lead, LATENT_DIM)
    rope = rows[..., LATENT_DIM + 16:].contiguous().view(torch.bfloat16)
    return torch.cat([lat, rope], dim=-1)


def dense_decode(
    backend: str, q: torch.Tensor, rows: torch.Tensor, block_table: torch.Tensor,
    cache_seqlens: torch.Tensor, *, fmt: KVFormat, softmax_scale: float | None,
    fp8_scale: torch.Tensor | None, check: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense decode through baseline ``backend``; arguments as `fp8mla.decode.dense_decode`,
    with ``rows`` the uint8 [num_pages, page_size, row_bytes] pool."""
    from fp8mla.decode import DecodePlan, as_cache_rows, check_paged_inputs, check_softmax_scale

    if backend not in BASELINES:
        raise ValueError(
            f"backend: expected fp8mla or one of {', '.join(BASELINES)}, got {backend!r}"
        )
    b, s_q, h, _ = q.shape
    check_int("batch (q.shape[0])", b, lo=1)  # the problems the native plan takes
    check_int("s_q (q.shape[1])", s_q, lo=1, hi=4)
    check_int("heads (q.shape[2])", h, lo=1, hi=128)
    check_tensor("kv_cache", rows, device=q.device)
    page_size = rows.shape[1]
    check_paged_inputs(block_table, cache_seqlens, b, page_size, rows.shape[0], q.device,
                       validate=check)
    scale = check_softmax_scale(softmax_scale)
    if fp8_scale is None:
        fp8_scale = torch.ones(1, dtype=torch.float32, device=q.device)
    if backend == "reference":
        kv = dequantize_kv(rows, fmt, fp8_scale)
        out, lse = reference.dense_mla_decode(q, kv, block_table, cache_seqlens, scale)
        return out.to(torch.bfloat16), lse
    if backend == "full_cast":
        pool = cast_rows_to_bf16(rows, fmt)
        table = block_table
    else:
        pages = block_table.long().clamp(0, rows.shape[0] - 1)  # padding: any page, never read
        pool = cast_rows_to_bf16(rows[pages.flatten()], fmt)
        table = torch.arange(pages.numel(), dtype=torch.int32, device=q.device).view(pages.shape)
    kernel_scale = fp8_scale if fmt.name == "fp8" else torch.ones_like(fp8_scale)
    plan = DecodePlan(batch=b, num_heads=h, s_q=s_q, kv_format="bf16", page_size=page_size,
                      cache_seqlens=cache_seqlens, softmax_scale=scale, device=q.device)
    return plan._launch(q, as_cache_rows(pool, plan.fmt, page_size), table, cache_seqlens,
                        kernel_scale)
