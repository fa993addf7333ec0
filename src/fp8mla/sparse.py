"""Sparse MLA (DeepSeek Sparse Attention) over top-k slot indices, decode and prefill.

Each query token attends to the cache rows its index list names (physical slots
page · page_size + offset, as FlashMLA's sparse kernels take them; −1 = skip; duplicates are
attended as listed). The kernel is the dense decode kernel with the block-table lookup replaced
by the index list (`fp8mla.kernels.decode`), so every KV format and head count 1–128 is served
as it is — no padding of 8 heads to 64. Programs of fewer than `COMPACT_MIN_ROWS` rows check
each entry in the attention loop (SPARSE=True); larger ones first compact the lists
(`fp8mla.kernels.compact`: valid entries in order at the front, and their count — a plan-owned
int32 [queries, topk] buffer) and read them as a block table of one-token pages — except on
SM90, where fp8 and fp8_ds_mla plans of ≥ 17 heads — and fp8_ds_mla plans of 9–16 heads for
at most `fp8mla.decode.SPARSE_SM90_SMALL_BATCH` queries, unless the plan is batch-invariant —
take a Gluon kernel (`fp8mla.kernels.decode_sm90`) and fp8_ds_mla plans of ≤ 8 heads another
(`fp8mla.kernels.decode_sm90_mma8_sparse`), each checking the entries itself.

Out-of-range indices: the validating path (``check=True``, default) raises; the fast path
(``check=False``) treats them as −1 and never reads outside the pool.
"""

from __future__ import annotations

import torch
import triton

from fp8mla import formats, numerics
from fp8mla._checks import (
    argument_names,
    check_fp8_scale,
    check_int,
    check_slot_range,
    check_tensor,
)
from fp8mla.decode import DecodePlan
from fp8mla.formats import KV_DIM, KVFormat
from fp8mla.kernels.compact import _compact_indices_kernel
from fp8mla.kernels.launch import fast

__all__ = ["SparsePlan", "sparse_decode", "sparse_prefill"]

# Programs of at least this many rows (heads per block) attend to compacted index lists: a
# first kernel moves each list's valid entries to its front and counts them
# (`_compact_indices_kernel`), and the attention kernel reads the result as the block table of
# one-token pages and the count as the length — its dense path, with no per-entry check.
# Fewer rows check every entry in the attention loop (SPARSE). H200, fp8_ds_mla, topk 2048,
# ABAB in one call (h200-20261201-s12-compact-ab*.json): 64-row programs 397.6 → 341.7 µs at
# B=128 × 128 heads, 780.2 → 670.0 at s_q 2, 121.4 → 103.6 at B=64 × 64 heads; 32 rows
# 100.9 → 99.7; 16 rows slower (B=64 × 8 heads 61.5 → 72.6, × 16 heads 67.8 → 77.4, B=128 × 8
# heads 99.0 → 119.6). (Read contiguously with only `position < count` as the mask, the lists
# measured 387 µs at B=128 × 128 heads: `-compact-ab3-contiguous.json`.)
# Targets whose programs reach 64 rows: SM90 (measured) and SM80 (untimed); SM86/89/100/120
# programs stop at 32 rows, so they keep checking each entry.
COMPACT_MIN_ROWS = 64


def _as_slot_rows(kv_cache: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """The pool as uint8 [num_slots, 1, row_bytes] (pages flattened: slots index it)."""
    from fp8mla.decode import as_cache_rows

    t = kv_cache
    if t.dim() == 2:  # [num_slots, row_bytes] (or bf16 [num_slots, 576])
        t = t.unsqueeze(1)
    rows = as_cache_rows(t, fmt)
    return rows.reshape(-1, 1, fmt.row_bytes)


class SparsePlan(DecodePlan):
    """A sparse-attention problem: ``num_queries`` query tokens, each with ``num_heads`` heads and
    an index list of width ``topk``. Plan once, `run` many (CUDA-graph safe with check=False).

    Args:
        num_queries: query tokens per call (batch · s_q for decode, tokens for prefill).
        num_heads: 1–128. topk: index-list width (≥ 1).
        kv_format: ``bf16`` / ``fp8`` / ``fp8_ds_mla``. softmax_scale: default 576^-0.5.
        fp8_scores: as `DecodePlan`'s (the ≤ 8-head SM90 kernel over fp8_ds_mla lists).
        batch_invariant: as `DecodePlan`'s — one split a query and a kernel that does not
            depend on ``num_queries`` (for a given ``topk``). own_outputs: as `DecodePlan`'s.

    Device memory: out / lse (and the split workspace) as `DecodePlan`'s; plans whose programs
    take ≥ `COMPACT_MIN_ROWS` heads on the Triton kernel (`compacts`) also hold the compacted
    lists, int32 [num_queries, topk] (4 · topk bytes per query, an eighth of out's at 64 heads
    and topk 2048).
    """

    sparse = True

    def __init__(self, *, num_queries: int, num_heads: int, topk: int,
                 kv_format: str | KVFormat, softmax_scale: float | None = None,
                 device: str | torch.device = "cuda", num_splits: int | None = None,
                 config=None, fp8_scores: bool | None = None,
                 batch_invariant: bool = False, own_outputs: bool = True) -> None:
        self.topk = check_int("topk", topk, lo=1)
        self._compact_min_rows = COMPACT_MIN_ROWS  # fixed per plan
        with argument_names({"batch": "num_queries", "max_seqlen": "topk"}):  # (its names)
            super().__init__(batch=num_queries, num_heads=num_heads, s_q=1,
                             kv_format=kv_format, page_size=1, max_seqlen=topk,
                             softmax_scale=softmax_scale, device=device, num_splits=num_splits,
                             config=config, fp8_scores=fp8_scores,
                             batch_invariant=batch_invariant, own_outputs=own_outputs)
        self._full_length = torch.full((num_queries,), topk, dtype=torch.int32,
                                       device=self.device)
        # the Gluon SM90 kernel checks the entries itself (compacted first, it measured 4–5 µs
        # slower: B=64 × 64 heads 84.4 vs 80.5 µs, h200-20261201-s15-bb2dfd3-sparse-sm90-ab)
        self.compacts = not self.checks_indices and not self.sm90
        if self.compacts:  # the compacted lists and their lengths
            self._kept = torch.empty(num_queries, topk, dtype=torch.int32, device=self.device)
            self._kept_len = torch.empty(num_queries, dtype=torch.int32, device=self.device)

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
            topk_length: torch.Tensor | None = None, *, fp8_scale: torch.Tensor | None = None,
            check: bool = True, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None,
            empty_lse: float = float("-inf")) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend. Graph-safe with ``check=False``.

        q: [num_queries, num_heads, 576] bfloat16 (last dim contiguous).
        kv_cache: the pool, uint8 [num_pages, page_size, row_bytes] (or [num_slots, row_bytes];
            bf16 caches may be passed as bf16 [..., 576]).
        indices: int32 [num_queries, topk], slots, −1 = skip.
        topk_length: int32 [num_queries], optional: only the first topk_length[t] entries count.
        fp8_scale: float32 [1], the ``fp8`` format's per-tensor scale.
        out / lse: where to write instead of the plan's buffers — bfloat16
            [num_queries, num_heads, 512] (last dim contiguous) / float32
            [num_queries, num_heads], any strides. empty_lse: the lse of a query with no valid
            index (−inf; FlashMLA returns +inf).
        Returns (out bfloat16 [num_queries, num_heads, 512], lse float32
        [num_queries, num_heads]): ``out`` / ``lse`` when given, else views of the plan's
        buffers. A query with no valid index gets out 0 and lse ``empty_lse``.
        """
        check_tensor("q", q, dtype=torch.bfloat16, shape=(self.batch, self.num_heads, KV_DIM),
                     device=self.device, contiguous_last=True)
        check_tensor("kv_cache", kv_cache, device=self.device)
        rows = _as_slot_rows(kv_cache, self.fmt)
        check_tensor("indices", indices, dtype=torch.int32, shape=(self.batch, self.topk),
                     device=self.device, contiguous_last=True)
        if topk_length is None:
            lengths = self._full_length
        else:
            lengths = check_tensor("topk_length", topk_length, dtype=torch.int32,
                                   shape=(self.batch,), device=self.device,
                                   contiguous_last=True)
        if check:
            self._validate(indices, lengths, rows.shape[0])
        check_fp8_scale(fp8_scale, self.device, validate=check and self.fmt.name == "fp8")
        scale = fp8_scale if fp8_scale is not None and self.fmt.name == "fp8" else self._unit_scale
        diagnose = numerics.enabled()
        if diagnose:
            slots = []
            for t, n in enumerate(lengths.tolist()):
                sl = indices[t, :n]
                slots.append(sl[(sl >= 0) & (sl < rows.shape[0])])
            numerics.check_attention_inputs("sparse_attention", q, rows.view(rows.shape[0], -1),
                                            self.fmt, slots, scale)
        self._check_timeline()
        outputs = self._outputs(out, lse, empty_lse, per_query=True)
        if self.compacts:
            fast(_compact_indices_kernel)[(self.batch,)](
                indices, lengths, self._kept, self._kept_len, indices.stride(0),
                self._kept.stride(0), self.topk, rows.shape[0],
                BLOCK=min(2048, triton.next_power_of_2(self.topk)), num_warps=4)
            indices, lengths = self._kept, self._kept_len
        out, lse = self._launch(q.unsqueeze(1), rows, indices, lengths, scale, *outputs)
        if diagnose:
            numerics.check_attention_outputs("sparse_attention", out, lse, empty_lse)
        return out[:, 0], lse[:, 0]

    @property
    def checks_indices(self) -> bool:
        """Whether the attention kernel checks every index-list entry (SPARSE) — programs of
        fewer than COMPACT_MIN_ROWS rows — or reads lists compacted first (the Triton kernel's
        flag; on SM90 the Gluon kernel that serves fp8 and fp8_ds_mla plans of ≥ 17 heads (and
        small batches of 9–16 fp8_ds_mla heads) checks entries itself, and `compacts` says
        whether the compaction runs)."""
        return self.config.heads_per_block < self._compact_min_rows

    @staticmethod
    def _validate(indices: torch.Tensor, lengths: torch.Tensor, num_slots: int) -> None:
        check_slot_range("indices", indices, num_slots)
        if lengths.numel():
            lo, hi = int(lengths.min()), int(lengths.max())
            if lo < 0 or hi > indices.shape[1]:
                raise ValueError(f"topk_length: expected values in [0, {indices.shape[1]}] "
                                 f"(the index width), got {lo if lo < 0 else hi}")


def _check_queries(q: torch.Tensor, queries: int) -> None:
    if queries == 0:
        raise ValueError(f"q: expected at least one query token, got shape {list(q.shape)}")


def sparse_prefill(
    q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
    kv_format: str | KVFormat, topk_length: torch.Tensor | None = None,
    softmax_scale: float | None = None, fp8_scale: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill. q: [tokens, heads, 576] bfloat16; indices: int32 [tokens, topk]
    (slots, −1 = skip); topk_length: int32 [tokens], optional; kv_cache: the pool, uint8
    [num_pages, page_size, row_bytes] or [num_slots, row_bytes] (bf16 caches also as bf16
    [..., 576]); fp8_scale: float32 [1], the ``fp8`` format's per-tensor scale (other formats
    ignore it). Returns (out bfloat16 [tokens, heads, 512], lse float32 [tokens, heads])."""
    check_tensor("q", q, dtype=torch.bfloat16, shape=(None, None, KV_DIM))
    _check_queries(q, q.shape[0])
    check_tensor("indices", indices, dtype=torch.int32, ndim=2)
    fmt = formats.kv_format(kv_format)
    plan = SparsePlan(num_queries=q.shape[0], num_heads=q.shape[1], topk=indices.shape[1],
                      kv_format=fmt, softmax_scale=softmax_scale, device=q.device)
    return plan.run(q, kv_cache, indices, topk_length, fp8_scale=fp8_scale, check=check)


def sparse_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
    kv_format: str | KVFormat, topk_length: torch.Tensor | None = None,
    softmax_scale: float | None = None, fp8_scale: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode. q: [batch, s_q, heads, 576] bfloat16; indices: int32
    [batch, s_q, topk] (slots, −1 = skip); topk_length: int32 [batch], optional (applies to
    every query of the request); kv_cache, fp8_scale: as `sparse_prefill`'s. Returns (out
    bfloat16 [batch, s_q, heads, 512], lse float32 [batch, s_q, heads])."""
    check_tensor("q", q, dtype=torch.bfloat16, shape=(None, None, None, KV_DIM))
    b, s_q, h, _ = q.shape
    _check_queries(q, b * s_q)
    check_tensor("indices", indices, dtype=torch.int32, shape=(b, s_q, None))
    lengths = None
    if topk_length is not None:
        check_tensor("topk_length", topk_length, dtype=torch.int32, shape=(b,))
        lengths = topk_length.repeat_interleave(s_q)
    out, lse = sparse_prefill(q.reshape(b * s_q, h, KV_DIM), kv_cache,
                              indices.reshape(b * s_q, -1), kv_format=kv_format,
                              topk_length=lengths, softmax_scale=softmax_scale,
                              fp8_scale=fp8_scale, check=check)
    return out.view(b, s_q, h, -1), lse.view(b, s_q, h)
