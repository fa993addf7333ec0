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

`dense_prefill_ragged` takes an engine's packed batch instead — requests of different numbers
of new tokens, q [tokens, heads, 576] cut by cu_seqlens_q — and cuts each request the same way
(`ragged_groups`): the group count is bounded by the shapes, so the groups are laid out on the
device without a host read, with empty groups (length 0) up to the bound.

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

__all__ = ["CHUNK_ENTRIES", "CHUNK_ROW_HEADS", "GROUP", "dense_prefill", "dense_prefill_ragged",
           "query_groups", "ragged_group_size", "ragged_groups", "row_chunks", "visible_slots"]

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


def ragged_group_size(tokens: int, batch: int) -> int:
    """Tokens a group of `dense_prefill_ragged` holds for ``tokens`` new tokens over ``batch``
    requests (both ≥ 1): min(`GROUP`, ceil(tokens / batch)), the mean a request — no host
    read sees how they spread."""
    check_int("tokens", tokens, lo=1)
    check_int("batch", batch, lo=1)
    return min(GROUP, -(-tokens // batch))


def ragged_groups(cu_seqlens_q: torch.Tensor, cache_seqlens: torch.Tensor, tokens: int,
                  group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode requests a ragged prefill cuts each request's new tokens into, built on the
    device (no host read): n = (tokens + (group − 1) · batch) // group of them, enough for
    request b's ceil(s_b / group) groups of ``group`` consecutive tokens (s_b = cu_seqlens_q[b +
    1] − cu_seqlens_q[b]; in token order, the first front-padded, each as long as its last token
    sees: cache_seqlens[b] − group · (its groups after it), 0 where negative), then empty groups
    of length 0 to n.

    cu_seqlens_q: int32 [batch + 1] (valid: from 0, non-decreasing, to ``tokens``; otherwise the
    rows stay inside [0, tokens] and the result is meaningless); cache_seqlens: int32 [batch].
    Returns (owner int64 [n]: each group's request; lens int32 [n]; rows int64 [n, group]: the q
    rows of each group's queries, ``tokens`` for padding and for the empty groups')."""
    check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, ndim=1)
    b, dev = cache_seqlens.shape[0], cache_seqlens.device
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, shape=(b + 1,), device=dev)
    check_int("tokens", tokens, lo=0)
    check_int("group", group, lo=1)
    n = (tokens + (group - 1) * b) // group if b else 0
    cu = cu_seqlens_q.long()
    s = (cu[1:] - cu[:-1]).clamp_min(0)
    groups = (s + group - 1) // group
    ends = groups.cumsum(0)  # one past each request's last group
    j = torch.arange(n, device=dev)
    owner = torch.searchsorted(ends, j, right=True).clamp_max(max(b - 1, 0))
    if n == 0:
        return owner, j.to(torch.int32), j[:, None].expand(0, group)
    real = j < ends[-1]
    k = j - (ends - groups)[owner]  # the group's place among its request's
    lens = cache_seqlens.long()[owner] - group * (groups[owner] - 1 - k)
    lens = torch.where(real, lens.clamp_min(0), 0).to(torch.int32)
    pad = (groups * group - s)[owner]  # padding rows before the request's first token
    at = k[:, None] * group + torch.arange(group, device=dev) - pad[:, None]  # token in request
    rows = cu[owner][:, None] + at
    keep = real[:, None] & (at >= 0) & (rows >= 0) & (rows < tokens)
    return owner, lens, torch.where(keep, rows, tokens)


def _check_prefill_inputs(q: torch.Tensor, kv_cache: torch.Tensor, fmt: KVFormat):
    """q's head dim (its last: contiguous, 576) and heads (the dim before; q's dtype and dims
    checked by the caller); the pool's rows (pages) and page size."""
    check_tensor("q", q, contiguous_last=True)
    if q.shape[-1] != KV_DIM:
        raise ValueError(f"q: expected head dim {KV_DIM} (512 latent + 64 rope), got "
                         f"{q.shape[-1]}")
    check_int(f"heads (q.shape[{q.dim() - 2}])", q.shape[-2], lo=1, hi=128)
    check_tensor("kv_cache", kv_cache, device=q.device)
    pages = as_cache_rows(kv_cache, fmt)
    return pages, check_page_size(pages.shape[1], "kv_cache (its page size)")


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
    each call builds its plans (not for CUDA-graph capture). Requests of different numbers of
    new tokens: `dense_prefill_ragged`.
    Returns (out bfloat16 [batch, S, heads, 512], lse float32 [batch, S, heads]).
    """
    fmt = formats.kv_format(kv_format)
    check_tensor("q", q, dtype=torch.bfloat16, ndim=4)
    pages, page_size = _check_prefill_inputs(q, kv_cache, fmt)
    b, s_q, h, _ = q.shape
    check_paged_inputs(block_table, cache_seqlens, b, page_size, pages.shape[0], q.device,
                       validate=check)
    check_fp8_scale(fp8_scale, q.device, validate=check and fmt.name == "fp8")
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
    out_rows, lse_rows = _outputs(b * s_q + int(q_v is None), h, q.device)
    out = out_rows[:b * s_q].view(b, s_q, h, LATENT_DIM)
    lse = lse_rows[:b * s_q].view(b, s_q, h)
    if n == 0 or block_table.shape[1] == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    row_of = None
    if q_v is None:
        pos = torch.arange(groups * group, device=q.device) - pad
        first = torch.arange(b, device=q.device)[:, None] * s_q
        row_of = torch.where(pos >= 0, first + pos, b * s_q).view(n, group)
    _attend_groups(
        q_v if q_v is not None else (lambda at: q[at // s_q, at % s_q]), row_of, out_rows,
        lse_rows, pages, block_table, torch.arange(b, device=q.device).repeat_interleave(groups),
        query_groups(cache_seqlens, s_q, group), fmt=fmt, page_size=page_size,
        softmax_scale=softmax_scale, fp8_scale=fp8_scale)
    return out, lse


def dense_prefill_ragged(
    q: torch.Tensor, cu_seqlens_q: torch.Tensor, kv_cache: torch.Tensor,
    block_table: torch.Tensor, cache_seqlens: torch.Tensor, *, kv_format: str | KVFormat,
    softmax_scale: float | None = None, fp8_scale: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`dense_prefill` of requests with different numbers of new tokens, packed: request b's
    s_b = cu_seqlens_q[b + 1] − cu_seqlens_q[b] new tokens are q's rows [cu_seqlens_q[b],
    cu_seqlens_q[b + 1]) (an engine's varlen batch; s_b = 0 allowed).

    q: bfloat16 [tokens, heads, 576] (heads 1–128); cu_seqlens_q: int32 [batch + 1], from 0,
    non-decreasing, to ``tokens``; kv_cache, block_table, fp8_scale, softmax_scale: as
    `dense_prefill`'s; cache_seqlens: int32 [batch], each request's length with its new tokens.
    Token i of request b sees its first cache_seqlens[b] − s_b + 1 + i tokens; one that sees
    none gets out 0 and lse −inf. The requests' tokens are cut into groups of
    `ragged_group_size` (`ragged_groups`, on the device: the group count is bounded by the
    shapes, so nothing is read on the host but with ``check`` (default: a sync), which also
    validates cu_seqlens_q; without it, invalid offsets give meaningless rows but no read or
    write outside q and the outputs). Not for CUDA-graph capture (plans are built per call).
    The group size follows the mean new tokens a request, as no host read can see the spread:
    a long prompt packed with many one-token requests gets small groups (each reads its
    context once: more groups, more reads), where groups of 4 would pad the short requests.
    Returns (out bfloat16 [tokens, heads, 512], lse float32 [tokens, heads]).
    """
    fmt = formats.kv_format(kv_format)
    check_tensor("q", q, dtype=torch.bfloat16, ndim=3)
    pages, page_size = _check_prefill_inputs(q, kv_cache, fmt)
    t, h, _ = q.shape
    check_tensor("cache_seqlens", cache_seqlens, ndim=1)
    b = cache_seqlens.shape[0]  # (its dtype, device and the block table's rows: below)
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, shape=(b + 1,),
                 device=q.device)
    check_paged_inputs(block_table, cache_seqlens, b, page_size, pages.shape[0], q.device,
                       validate=check)
    check_fp8_scale(fp8_scale, q.device, validate=check and fmt.name == "fp8")
    if check:
        _check_offsets(cu_seqlens_q.cpu(), t)
    out_rows, lse_rows = _outputs(t + 1, h, q.device)  # a spare last row for padding
    out, lse = out_rows[:t], lse_rows[:t]
    if t == 0 or b == 0 or block_table.shape[1] == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    group = ragged_group_size(t, b)
    owner, lens, row_of = ragged_groups(cu_seqlens_q, cache_seqlens, t, group)
    _attend_groups(lambda at: q[at], row_of, out_rows, lse_rows, pages, block_table, owner,
                   lens, fmt=fmt, page_size=page_size, softmax_scale=softmax_scale,
                   fp8_scale=fp8_scale)
    return out, lse


def _check_offsets(cu: torch.Tensor, tokens: int) -> None:
    """cu (int32 [batch + 1], on the host): from 0, non-decreasing, to ``tokens``, or a
    ValueError naming the first entry that is not."""
    drops = torch.nonzero(cu[1:] < cu[:-1]).flatten()
    at = 0 if int(cu[0]) != 0 else (int(drops[0]) + 1 if drops.numel() else
                                     (cu.shape[0] - 1 if int(cu[-1]) != tokens else None))
    if at is not None:
        raise ValueError(f"cu_seqlens_q: expected offsets from 0, non-decreasing, to {tokens} "
                         f"(q's tokens), got {int(cu[at])} at entry {at}")


def _outputs(rows: int, heads: int, device: torch.device):
    """Uninitialized output rows: bfloat16 [rows, heads, 512], float32 [rows, heads]."""
    return (torch.empty(rows, heads, LATENT_DIM, dtype=torch.bfloat16, device=device),
            torch.empty(rows, heads, dtype=torch.float32, device=device))


def _attend_groups(q_src, row_of, out_rows, lse_rows, pages, block_table, owner, lens, *, fmt,
                   page_size, softmax_scale, fp8_scale) -> None:
    """Runs n groups of queries as the requests of decode plans (s_q = the group size), a chunk
    (`row_chunks`) at a time, into out_rows / lse_rows (bfloat16 [rows, heads, 512], float32
    [rows, heads]).

    row_of None: q_src is q's groups, bfloat16 [n, group, heads, 576], and out_rows / lse_rows
    their rows in the same order. Else row_of (int64 [n, group]) names each query's output row,
    the last row (a spare) for padding, and q_src(rows) gives q's rows at those indices
    (< the spare) as bfloat16 [len(rows), heads, 576]: each chunk's are gathered, its padding
    zeroed, and its outputs scattered. owner: int64 [n], each group's row of block_table; lens:
    int32 [n], each group's length (what its last query sees)."""
    n = owner.shape[0]
    h = out_rows.shape[1]
    group = row_of.shape[1] if row_of is not None else q_src.shape[1]
    spare = out_rows.shape[0] - 1
    span = block_table.shape[1] * page_size  # the lengths' bound: plans need no host read
    plans: dict[int, DecodePlan] = {}  # by chunk size: every chunk but the last shares one
    for r0, r1 in row_chunks(n, block_table.shape[1], heads=group * h):
        plan = plans.get(r1 - r0)
        if plan is None:
            plan = plans[r1 - r0] = DecodePlan(
                batch=r1 - r0, num_heads=h, kv_format=fmt, page_size=page_size,
                max_seqlen=span, s_q=group, softmax_scale=softmax_scale, device=pages.device,
                own_outputs=False)
        if row_of is None:
            q_c = q_src[r0:r1]
            out_c = out_rows.view(n, group, h, LATENT_DIM)[r0:r1]
            lse_c = lse_rows.view(n, group, h)[r0:r1]
        else:
            rows = row_of[r0:r1].reshape(-1)
            q_c = q_src(rows.clamp_max(spare - 1))
            q_c = q_c.masked_fill_((rows == spare)[:, None, None], 0).view(r1 - r0, group, h,
                                                                             KV_DIM)
            out_c = torch.empty(r1 - r0, group, h, LATENT_DIM, dtype=torch.bfloat16,
                                device=out_rows.device)
            lse_c = torch.empty(r1 - r0, group, h, dtype=torch.float32, device=out_rows.device)
        plan.run(q_c, pages, block_table[owner[r0:r1]], lens[r0:r1], fp8_scale=fp8_scale,
                 check=False, out=out_c, lse=lse_c)
        if row_of is not None:
            out_rows.index_copy_(0, rows, out_c.view(-1, h, LATENT_DIM))
            lse_rows.index_copy_(0, rows, lse_c.view(-1, h))
