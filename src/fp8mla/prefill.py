"""Dense MLA prefill over a paged cache: the sparse kernel over every visible token.

Query i of request b's S new tokens sees the request's first cache_seqlens[b] − S + 1 + i
cached tokens (causal, the dense decode's rule for any S). There is no dense prefill kernel of
its own: each query row's index list is the slots of the tokens it sees, in position order,
and `fp8mla.sparse.SparsePlan` attends to them (every KV format read as stored, heads 1–128),
its ``topk_length`` stopping each row at its visible count. The lists are built for
`CHUNK_ENTRIES` index entries at a time (query rows × the longest visible count) and at most
`CHUNK_ROW_HEADS` query rows × heads, so memory stays bounded for long prompts: a 32K-token
prompt over its own 32K tokens would need 4 GB of int32 lists at once.

Cost: the lists are written and read once per chunk (4 bytes a (query, token) pair against the
row's 576–1152 bytes the kernel reads for it), and each query row reads its rows itself, as a
sparse decode does — compute-bound at high head counts, no K/V reuse across queries.
"""

from __future__ import annotations

import torch

from fp8mla import formats
from fp8mla._checks import check_fp8_scale, check_int, check_page_size, check_tensor
from fp8mla.decode import as_cache_rows, check_paged_inputs
from fp8mla.formats import KV_DIM, LATENT_DIM, KVFormat

__all__ = ["CHUNK_ENTRIES", "CHUNK_ROW_HEADS", "dense_prefill", "visible_slots", "row_chunks"]

#: index-list entries built at once (query rows × their longest visible count): 64 MB of int32
CHUNK_ENTRIES = 1 << 24
#: query rows × heads a chunk's sparse plan serves: its buffers of a row and head (the max
#: logits; a split workspace, where it splits) stay bounded
CHUNK_ROW_HEADS = 1 << 16


def row_chunks(rows: int, width: int, entries: int | None = None,
               heads: int = 1) -> list[tuple[int, int]]:
    """``[start, end)`` ranges covering ``rows`` query rows, each of at most ``entries //
    width`` rows (``entries`` default `CHUNK_ENTRIES`) and `CHUNK_ROW_HEADS` // ``heads``
    rows, at least one."""
    entries = CHUNK_ENTRIES if entries is None else entries
    step = max(1, min(entries // max(1, width), CHUNK_ROW_HEADS // max(1, heads)))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def visible_slots(block_table: torch.Tensor, request: torch.Tensor, visible: torch.Tensor,
                  width: int, page_size: int) -> torch.Tensor:
    """Index lists of query rows that see their request's first tokens: int32 [rows, width],
    entry p the slot of position p (block_table[request, p // page_size] · page_size +
    p % page_size) where p < visible, −1 after.

    block_table: int32 [batch, max_pages]; request: int64 [rows], each row's request (a row of
    block_table); visible: int32 / int64 [rows], tokens each row sees (≤ width, and within
    the pages block_table lists)."""
    pos = torch.arange(width, dtype=torch.int32, device=block_table.device)
    cols = (pos // page_size).clamp_max(block_table.shape[1] - 1)
    slots = block_table[request[:, None], cols[None, :]]  # int32 [rows, width], in place below
    slots.mul_(page_size).add_(pos % page_size)  # (pages of the pool: slots fit int32)
    return slots.masked_fill_(pos[None, :] >= visible[:, None], -1)


def dense_prefill(
    q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    cache_seqlens: torch.Tensor, *, kv_format: str | KVFormat, softmax_scale: float | None = None,
    fp8_scale: torch.Tensor | None = None, check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal MLA attention of each request's S new tokens over its paged cache (the new tokens'
    rows already stored).

    q: bfloat16 [batch, S, heads, 576] (S ≥ 1, heads 1–128); kv_cache: the pool, uint8
    [num_pages, page_size, row_bytes] (bf16 caches also as bf16 [num_pages, page_size, 576];
    any power-of-two page size); block_table: int32 [batch, max_pages]; cache_seqlens: int32
    [batch], each request's length with its new tokens; fp8_scale: float32 [1], the ``fp8``
    format's per-tensor scale (other formats ignore it); softmax_scale: default 576^-0.5.
    Query i sees tokens s < cache_seqlens[b] − S + 1 + i; one that sees none gets out 0 and lse
    −inf. Reads cache_seqlens on the host (a sync: not for CUDA-graph capture), and with
    ``check`` (default) validates the block table's pages within the lengths.
    Returns (out bfloat16 [batch, S, heads, 512], lse float32 [batch, S, heads]).
    """
    from fp8mla.sparse import SparsePlan

    fmt = formats.kv_format(kv_format)
    check_tensor("q", q, dtype=torch.bfloat16, ndim=4, contiguous_last=True)
    b, s_q, h, d = q.shape
    if d != KV_DIM:
        raise ValueError(f"q: expected head dim {KV_DIM} (512 latent + 64 rope), got {d}")
    check_int("heads (q.shape[2])", h, lo=1, hi=128)
    check_tensor("kv_cache", kv_cache, device=q.device)
    pages = as_cache_rows(kv_cache, fmt)
    page_size = check_page_size(pages.shape[1], "kv_cache (its page size)")
    check_paged_inputs(block_table, cache_seqlens, b, page_size, pages.shape[0], q.device,
                       validate=check)
    check_fp8_scale(fp8_scale, q.device, validate=check and fmt.name == "fp8")
    out = torch.zeros(b, s_q, h, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((b, s_q, h), float("-inf"), dtype=torch.float32, device=q.device)
    width = int(cache_seqlens.max()) if b * s_q else 0
    if width == 0:
        return out, lse
    rows = torch.arange(b * s_q, device=q.device)
    request = rows // s_q
    visible = (cache_seqlens.long()[request] - s_q + 1 + rows % s_q).clamp(0, width)
    q_rows, out_rows, lse_rows = q.reshape(b * s_q, h, KV_DIM), out.view(-1, h, LATENT_DIM), \
        lse.view(-1, h)
    plans: dict[int, SparsePlan] = {}  # by chunk rows: every chunk but the last shares one
    for r0, r1 in row_chunks(b * s_q, width, heads=h):
        idx = visible_slots(block_table, request[r0:r1], visible[r0:r1], width, page_size)
        plan = plans.get(r1 - r0)
        if plan is None:
            plan = plans[r1 - r0] = SparsePlan(num_queries=r1 - r0, num_heads=h, topk=width,
                                               kv_format=fmt, softmax_scale=softmax_scale,
                                               device=q.device, own_outputs=False)
        plan.run(q_rows[r0:r1], pages, idx, visible[r0:r1].to(torch.int32),
                 fp8_scale=fp8_scale, check=False, out=out_rows[r0:r1], lse=lse_rows[r0:r1])
    return out, lse
