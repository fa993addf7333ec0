"""PyTorch float32 oracles (docs/DESIGN.md §2): readable per-request loops, no performance intent.

Every kernel is tested against these. Caches are passed already dequantized (float32
``[num_pages, page_size, 576]``, e.g. `PagedKVCache.dequantize`), so format decoding and
attention are checked separately. LSE is the natural log of Σ exp(score), float32; a query that
sees no token gets output 0 and LSE −inf.
"""

from __future__ import annotations

import torch

from fp8mla.formats import LATENT_DIM

__all__ = ["dense_mla_decode", "sparse_mla", "indexer_logits", "topk_indices"]


def _attend(q: torch.Tensor, kv: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [H, 576], kv: [n, 576] float32 → (out [H, 512], lse [H])."""
    if kv.shape[0] == 0:
        h = q.shape[0]
        return q.new_zeros(h, LATENT_DIM), q.new_full((h,), float("-inf"))
    s = (q @ kv.T) * scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ kv[:, :LATENT_DIM], lse


def dense_mla_decode(
    q: torch.Tensor, kv: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA decode over a paged cache.

    q: any float dtype (computed in float32) [batch, s_q, heads, 576]; kv: float32 [num_pages,
    page_size, 576]; block_table: int [batch, max_pages]; cache_seqlens: int [batch]. Query i of s_q sees tokens
    s < cache_seqlens[b] − s_q + 1 + i. Returns out float32 [batch, s_q, heads, 512] and lse
    float32 [batch, s_q, heads].
    """
    b_sz, s_q, h, _ = q.shape
    page_size = kv.shape[1]
    out = torch.zeros(b_sz, s_q, h, LATENT_DIM, dtype=torch.float32, device=q.device)
    lse = torch.full((b_sz, s_q, h), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(b_sz):
        n = int(cache_seqlens[b])
        pos = torch.arange(n, device=q.device)
        rows = kv[block_table[b, pos // page_size].long(), pos % page_size].float()
        for i in range(s_q):
            visible = max(0, min(n, n - s_q + 1 + i))
            out[b, i], lse[b, i] = _attend(q[b, i].float(), rows[:visible], softmax_scale)
    return out, lse


def sparse_mla(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA over listed slots.

    q: any float dtype (computed in float32) [tokens, heads, 576]; kv: float32 [num_slots,
    576] (a paged cache flattened by slot);
    indices: int [tokens, topk], −1 = skip, duplicates attended as listed; topk_length: int
    [tokens] (only the first topk_length[t] entries count), optional. Returns out float32
    [tokens, heads, 512], lse float32 [tokens, heads].
    """
    t_sz, h, _ = q.shape
    out = torch.zeros(t_sz, h, LATENT_DIM, dtype=torch.float32, device=q.device)
    lse = torch.full((t_sz, h), float("-inf"), dtype=torch.float32, device=q.device)
    for t in range(t_sz):
        idx = indices[t].long()
        if topk_length is not None:
            idx = idx[: int(topk_length[t])]
        idx = idx[idx >= 0]
        out[t], lse[t] = _attend(q[t].float(), kv[idx].float(), softmax_scale)
    return out, lse


def indexer_logits(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, starts: torch.Tensor,
    ends: torch.Tensor,
) -> torch.Tensor:
    """Lightning-indexer logits: Σ_j w[t,j] · ReLU(q[t,j] · k[s]) for start[t] <= s < end[t].

    q: any float dtype [tokens, index_heads, dim] (dequantized, its per-token scale folded
    into weights); weights: any float dtype [tokens, index_heads]; keys: float32 [seq, dim]
    (dequantized: key scale applied); starts, ends: int [tokens]. Returns float32
    [tokens, seq], −inf outside each row's window.
    """
    t_sz, seq = q.shape[0], keys.shape[0]
    logits = torch.full((t_sz, seq), float("-inf"), dtype=torch.float32, device=q.device)
    for t in range(t_sz):
        lo, hi = int(starts[t]), int(ends[t])
        if hi > lo:
            dots = torch.relu(q[t].float() @ keys[lo:hi].float().T)  # [heads, hi - lo]
            logits[t, lo:hi] = weights[t].float() @ dots
    return logits


def topk_indices(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k largest finite logits per row, largest first, ties toward the lower
    position; −inf entries are never chosen; rows with fewer candidates are padded with −1.

    logits: float [rows, length] → int32 [rows, k].
    """
    rows, length = logits.shape
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    for r in range(rows):
        finite = torch.nonzero(logits[r] > float("-inf")).flatten()
        vals = logits[r, finite]
        order = sorted(range(len(finite)), key=lambda i: (-float(vals[i]), int(finite[i])))
        chosen = finite[order[:k]]
        out[r, : len(chosen)] = chosen.to(torch.int32)
    return out
