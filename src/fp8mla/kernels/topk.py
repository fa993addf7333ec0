"""Exact top-k per row by radix select (k up to a few thousand, rows of any length).

Keys: float32 logits mapped to order-preserving uint32 (flip all bits of negatives, the sign bit
of the rest); −inf and NaN are never candidates. Four passes find the k-th largest key T one byte
at a time (a 256-bin histogram of the next byte among elements matching the bytes found so far);
a last pass, in position order, emits every position with key > T and the lowest-positioned ones
with key == T until k are taken. Output positions are in ascending order; a row with fewer than
k candidates emits them all and pads with −1. Optionally each position p of row r is mapped to its
physical slot block_table[r // ROWS_PER_REQ, p // page_size] · page_size + p % page_size.
Memory: the row is read five times (from L2 when it fits); nothing is allocated per row.
"""

import triton
import triton.language as tl


@triton.jit
def _keys(x):
    """Order-preserving uint32 image of float32 (as int64 so comparisons stay unsigned)."""
    bits = x.to(tl.int32, bitcast=True)
    flipped = tl.where(bits < 0, ~bits, bits | (-2147483648))
    return flipped.to(tl.int64) & 0xFFFFFFFF


@triton.jit
def _topk_kernel(
    logits_ptr, out_ptr, block_table_ptr, length_ptr,
    stride_lr, stride_or, stride_bt, k, page_size,
    BLOCK: tl.constexpr, ROWS_PER_REQ: tl.constexpr, TO_SLOTS: tl.constexpr,
):
    r = tl.program_id(0)
    row = logits_ptr + r.to(tl.int64) * stride_lr
    length = tl.load(length_ptr + r)
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 512)

    # --- radix select: the k-th largest key, one byte per pass --------------------------------
    prefix = tl.zeros((), tl.int64)
    k_rem = k
    n_valid = 0
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        hist = tl.zeros((512,), tl.int32)
        for s0 in range(0, length, BLOCK):
            pos = s0 + offs
            x = tl.load(row + pos, mask=pos < length, other=float("-inf"))
            valid = (pos < length) & (x > float("-inf")) & (x == x)
            key = _keys(x)
            match = valid & ((key >> (shift + 8)) == prefix)
            digit = tl.where(match, (key >> shift) & 0xFF, 256).to(tl.int32)
            hist += tl.histogram(digit, 512)
        hist = tl.where(bins < 256, hist, 0)
        if p == 0:
            n_valid = tl.sum(hist, axis=0)
        # bins at or above d hold at_or_above[d] candidates; take the highest d reaching k_rem
        at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        d = tl.max(tl.where((at_or_above >= k_rem) & (bins < 256), bins, 0), axis=0)
        above = tl.sum(tl.where(bins > d, hist, 0), axis=0)
        k_rem = k_rem - above
        prefix = (prefix << 8) | d.to(tl.int64)
    take_all = n_valid <= k
    threshold = prefix  # the k-th largest key (when take_all is false)
    need_eq = k_rem  # how many keys equal to the threshold still belong to the top k

    # --- emit positions in order ---------------------------------------------------------------
    out_row = out_ptr + r.to(tl.int64) * stride_or
    # a scalar flag broadcast explicitly (the interpreter rejects block & scalar masks)
    take_all_v = (tl.zeros((BLOCK,), tl.int32) + take_all.to(tl.int32)) != 0
    n_out = 0
    n_eq = 0
    for s0 in range(0, length, BLOCK):
        pos = s0 + offs
        x = tl.load(row + pos, mask=pos < length, other=float("-inf"))
        valid = (pos < length) & (x > float("-inf")) & (x == x)
        key = _keys(x)
        eq = valid & (key == threshold)
        eq_rank = n_eq + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        sel = valid & (take_all_v | (key > threshold) | (eq & (eq_rank < need_eq)))
        dst = n_out + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        val = pos
        if TO_SLOTS:
            page = tl.load(block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt
                           + pos // page_size, mask=sel, other=0)
            val = page * page_size + pos % page_size
        tl.store(out_row + dst, val, mask=sel & (dst < k))
        n_out += tl.sum(sel.to(tl.int32), axis=0)
        n_eq += tl.sum(eq.to(tl.int32), axis=0)
    # --- pad -------------------------------------------------------------------------------------
    for s0 in range(0, k, BLOCK):
        o = s0 + offs
        tl.store(out_row + o, tl.full((BLOCK,), -1, tl.int32), mask=(o >= n_out) & (o < k))
