"""Dense MLA prefill over a paged cache: the dense decode kernel over groups of new tokens.

Query i of request b's S new tokens sees the request's first cache_seqlens[b] − S + 1 + i
cached tokens (causal, the dense decode's rule for any S). There is no dense prefill kernel of
its own: the S tokens are cut into groups of `GROUP` consecutive ones (fewer where S is), each
a request of `fp8mla.decode.DecodePlan` whose s_q queries are causal among themselves — the
group ending at token i has length cache_seqlens[b] − S + 1 + i, so its queries see exactly
the prefill's tokens. A group's queries share every KV tile the kernel reads: each cached row
is read once a group instead of once a query (a quarter of the bytes at GROUP = 4), no index
lists are built, and the decode kernel's tuned SM90 forms serve it (every KV format read as
stored, heads 1–128). Where S is not a multiple of the group size the first group is padded
at the front with query rows of zeros, whose outputs are dropped; then (or where q's batch and
token dimensions do not merge into one) q's rows are gathered and the outputs scattered a
chunk at a time, never as a copy of the whole prompt.

The requests are served `CHUNK_ENTRIES` block-table entries at a time (each group's row of
the block table is gathered for it) and at most `CHUNK_ROW_HEADS` query rows × heads (the
plan's buffers of a row and head), so memory stays bounded for long prompts.

Cost: each group's queries read the rows their last query sees, as one decode request with
s_q = GROUP: ~S / GROUP × the context's bytes a prompt, compute-bound from a few heads
(a group of 4 queries × 16 heads does 242 FLOPs a byte of fp8 rows).
"""

from __future__ import annotations

import torch

from fp8mla import formats
from fp8mla._checks import check_fp8_scale, check_int, check_page_size, check_tensor
from fp8mla.decode import DecodePlan, as_cache_rows, check_paged_inputs
from fp8mla.formats import KV_DIM, LATENT_DIM, KVFormat

__all__ = ["CHUNK_ENTRIES", "CHUNK_ROW_HEADS", "GROUP", "dense_prefill", "query_groups",
           "row_chunks", "visible_slots"]

#: new tokens a decode request of the prefill holds: `fp8mla.decode.DecodePlan`'s s_q bound
GROUP = 4
#: int32 entries built at once: block-table rows gathered for a chunk of groups (groups × the
#: table's width), or index lists (`visible_slots`: query rows × their longest visible count;
#: the layer's cast baselines and reference): 64 MB
CHUNK_ENTRIES = 1 << 24
#: query rows × heads a chunk's decode plan serves: its buffers of a row and head (the max
#: logits; a split workspace, where it splits) stay bounded
CHUNK_ROW_HEADS = 1 << 16


def row_chunks(rows: int, width: int, entries: int | None = None,
               heads: int = 1) -> list[tuple[int, int]]:
    """``[start, end)`` ranges covering ``rows`` rows, each of at most ``entries // width``
    rows (``entries`` default `CHUNK_ENTRIES`) and `CHUNK_ROW_HEADS` // ``heads`` rows, at
    least one."""
    entries = CHUNK_ENTRIES if entries is None else entries
    step = max(1, min(entries // max(1, width), CHUNK_ROW_HEADS // max(1, heads)))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def query_groups(cache_seqlens: torch.Tensor, s: int, group: int) -> torch.Tensor:
    """Lengths of the decode requests the prefill cuts each request's ``s`` new tokens into:
    int32 [batch · ceil(s / group)], request b's groups in token order, each of ``group``
    consecutive tokens (the first front-padded) and as long as its last token sees —
    cache_seqlens[b] − group · (groups − 1 − k) for group k, 0 where that is negative (its
    queries see nothing). cache_seqlens: int32 [batch]."""
    check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, ndim=1)
    check_int("s", s, lo=0)
    check_int("group", group, lo=1)
    groups = -(-s // group)
    back = group * torch.arange(groups - 1, -1, -1, device=cache_seqlens.device)
    return (cache_seqlens.long()[:, None] - back).clamp_min(0).to(torch.int32).reshape(-1)


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
    −inf. Plans are sized for the block table's span, so nothing is read on the host but with
    ``check`` (default: a sync), which validates the block table's pages within the lengths;
    each call builds its plans (not for CUDA-graph capture).
    Returns (out bfloat16 [batch, S, heads, 512], lse float32 [batch, S, heads]).
    """
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
    span = block_table.shape[1] * page_size  # the lengths' bound: plans need no host read
    group = min(s_q, GROUP)
    groups = -(-s_q // group) if s_q else 0
    pad = groups * group - s_q  # query rows before the first token: zeros, outputs dropped
    n = b * groups  # the decode requests, request b's groups in token order
    q_v = None
    if pad == 0:  # whole groups: a view of q where its batch and token dims merge
        try:
            q_v = q.view(n, group, h, KV_DIM)
        except RuntimeError:
            pass
    # otherwise q's rows are gathered and the outputs scattered a chunk at a time (never a
    # whole-prompt copy), a padding position's into a spare last row of the outputs
    spare = int(q_v is None)
    out_rows = torch.empty(b * s_q + spare, h, LATENT_DIM, dtype=torch.bfloat16,
                           device=q.device)
    lse_rows = torch.empty(b * s_q + spare, h, dtype=torch.float32, device=q.device)
    out = out_rows[:b * s_q].view(b, s_q, h, LATENT_DIM)
    lse = lse_rows[:b * s_q].view(b, s_q, h)
    if q_v is None:
        pos = torch.arange(groups * group, device=q.device) - pad
        first = torch.arange(b, device=q.device)[:, None] * s_q
        row_of = torch.where(pos >= 0, first + pos, b * s_q).view(n, group)
    if n == 0 or span == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    lens = query_groups(cache_seqlens, s_q, group)
    owner = torch.arange(b, device=q.device).repeat_interleave(groups)
    plans: dict[int, DecodePlan] = {}  # by chunk size: every chunk but the last shares one
    for r0, r1 in row_chunks(n, block_table.shape[1], heads=group * h):
        plan = plans.get(r1 - r0)
        if plan is None:
            plan = plans[r1 - r0] = DecodePlan(
                batch=r1 - r0, num_heads=h, kv_format=fmt, page_size=page_size,
                max_seqlen=span, s_q=group, softmax_scale=softmax_scale, device=q.device,
                own_outputs=False)
        if q_v is not None:
            q_c = q_v[r0:r1]
            out_c = out_rows.view(n, group, h, LATENT_DIM)[r0:r1]
            lse_c = lse_rows.view(n, group, h)[r0:r1]
        else:
            rows = row_of[r0:r1].reshape(-1)
            at = rows.clamp_max(b * s_q - 1)
            q_c = q[at // s_q, at % s_q].masked_fill_((rows == b * s_q)[:, None, None], 0)
            q_c = q_c.view(r1 - r0, group, h, KV_DIM)
            out_c = torch.empty(r1 - r0, group, h, LATENT_DIM, dtype=torch.bfloat16,
                                device=q.device)
            lse_c = torch.empty(r1 - r0, group, h, dtype=torch.float32, device=q.device)
        plan.run(q_c, pages, block_table[owner[r0:r1]], lens[r0:r1], fp8_scale=fp8_scale,
                 check=False, out=out_c, lse=lse_c)
        if q_v is None:
            out_rows.index_copy_(0, rows, out_c.view(-1, h, LATENT_DIM))
            lse_rows.index_copy_(0, rows, lse_c.view(-1, h))
    return out, lse
