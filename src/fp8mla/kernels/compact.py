"""Index-list compaction for sparse attention (one kernel).

Each query's list keeps its valid entries — inside the query's length and inside the pool
(0 ≤ slot < num_slots) — in order at the front, and their count. The attention kernel then reads
the list like a block table of one-token pages: its only mask is ``position < count``, one
affine compare, instead of a data-dependent validity mask rebuilt in every register layout of
every tile (and by every head block of the query).
"""

import triton
import triton.language as tl


@triton.jit
def _compact_indices_kernel(idx_ptr, len_ptr, out_ptr, count_ptr, stride_idx, stride_out,
                            topk, num_slots, BLOCK: tl.constexpr):
    """Program t: list t. idx [queries, topk] int32 (−1 or any slot outside [0, num_slots):
    skip), len [queries] int32 (entries past it skip) → out [queries, topk] int32 (the valid
    entries first, in order; the rest unwritten), count [queries] int32."""
    t = tl.program_id(0)
    length = tl.maximum(tl.minimum(tl.load(len_ptr + t), topk), 0)
    src = idx_ptr + t.to(tl.int64) * stride_idx
    dst = out_ptr + t.to(tl.int64) * stride_out
    kept = 0
    for p0 in range(0, length, BLOCK):
        pos = p0 + tl.arange(0, BLOCK)
        v = tl.load(src + pos, mask=pos < length, other=-1)
        ok = (v >= 0) & (v < num_slots)
        rank = tl.cumsum(ok.to(tl.int32), axis=0)  # 1-based place among this block's kept
        tl.store(dst + kept + rank - 1, v, mask=ok)
        kept += tl.sum(ok.to(tl.int32), axis=0)
    tl.store(count_ptr + t, kept)
