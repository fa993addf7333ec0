"""Exact top-k per row by radix select (k up to a few thousand, rows of any length).

Keys: float32 logits mapped to order-preserving uint32 (flip all bits of negatives, the sign bit
of the rest); −inf and NaN are never candidates. Eight passes find the k-th largest key T four
bits at a time (a 16-bin histogram of the next digit among elements matching the digits found so
far; 4-bit digits keep the warp-ballot histogram at ~10 instructions per element, where 8-bit
digits cost ~90); a last pass, in position order, emits every position with key > T and the
lowest-positioned ones with key == T until k are taken (one prefix scan of both counts packed
into one int32). Output positions are in ascending order; a row with fewer than k candidates
emits them all and pads with −1. Optionally each position p of row r is mapped to its physical
slot block_table[r // ROWS_PER_REQ, p // page_size] · page_size + p % page_size.
ONE_BLOCK (row ≤ BLOCK): the row is loaded once and every pass works on registers; otherwise
each pass re-reads the row (from L2 when it fits). Nothing is allocated per row.
"""

import triton
import triton.language as tl

DIGIT_BITS = tl.constexpr(4)
NO_MATCH = tl.constexpr(16)  # histogram bin of elements outside the prefix found so far


@triton.jit
def _load_keys(row, s0, length, BLOCK: tl.constexpr):
    """Positions, validity and order-preserving uint32 keys of row[s0 : s0 + BLOCK]."""
    pos = s0 + tl.arange(0, BLOCK)
    x = tl.load(row + pos, mask=pos < length, other=float("-inf"))
    valid = (pos < length) & (x > float("-inf")) & (x == x)
    bits = x.to(tl.int32, bitcast=True)
    flipped = tl.where(bits < 0, ~bits, bits | (-2147483648))
    return pos, valid, flipped.to(tl.uint32, bitcast=True)


@triton.jit
def _digit_hist(valid, key, prefix, SHIFT: tl.constexpr):
    """16-bin histogram of key's digit at SHIFT among keys whose higher digits equal prefix
    (bin NO_MATCH counts the rest)."""
    if SHIFT + DIGIT_BITS == 32:  # the first digit: no prefix yet (a 32-bit shift is undefined)
        match = valid
    else:
        match = valid & ((key >> (SHIFT + DIGIT_BITS)) == prefix)
    digit = tl.where(match, (key >> SHIFT) & 15, NO_MATCH).to(tl.int32)
    return tl.histogram(digit, 32)


@triton.jit
def _topk_kernel(
    logits_ptr, out_ptr, block_table_ptr, length_ptr,
    stride_lr, stride_or, stride_bt, k, page_size,
    BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr, ROWS_PER_REQ: tl.constexpr,
    TO_SLOTS: tl.constexpr,
):
    r = tl.program_id(0)
    row = logits_ptr + r.to(tl.int64) * stride_lr
    length = tl.load(length_ptr + r)
    bins = tl.arange(0, 32)
    if ONE_BLOCK:
        pos1, valid1, key1 = _load_keys(row, 0, length, BLOCK)

    # --- radix select: the k-th largest key, one 4-bit digit per pass ------------------------
    prefix = tl.zeros((), tl.uint32)
    k_rem = k
    n_valid = 0
    for p in tl.static_range(32 // DIGIT_BITS):
        shift = 32 - DIGIT_BITS * (p + 1)
        if ONE_BLOCK:
            hist = _digit_hist(valid1, key1, prefix, shift)
        else:
            hist = tl.zeros((32,), tl.int32)
            for s0 in range(0, length, BLOCK):
                pos, valid, key = _load_keys(row, s0, length, BLOCK)
                hist += _digit_hist(valid, key, prefix, shift)
        hist = tl.where(bins < NO_MATCH, hist, 0)
        if p == 0:
            n_valid = tl.sum(hist, axis=0)
        # bins at or above d hold at_or_above[d] candidates; take the highest d reaching k_rem
        at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        d = tl.max(tl.where((at_or_above >= k_rem) & (bins < NO_MATCH), bins, 0), axis=0)
        above = tl.sum(tl.where(bins > d, hist, 0), axis=0)
        k_rem = k_rem - above
        prefix = (prefix << DIGIT_BITS) | d.to(tl.uint32)
    # the k-th largest key, or (fewer than k candidates) 0: every valid key is above 0
    threshold = tl.where(n_valid <= k, 0, prefix)
    need_eq = tl.where(n_valid <= k, 0, k_rem)  # keys equal to threshold in the top k

    # --- emit positions in order: rank = (# above so far) + min(# equal so far, need_eq) ------
    out_row = out_ptr + r.to(tl.int64) * stride_or
    n_gt = 0
    n_eq = 0
    for s0 in range(0, length, BLOCK):
        if ONE_BLOCK:
            pos, valid, key = pos1, valid1, key1
        else:
            pos, valid, key = _load_keys(row, s0, length, BLOCK)
        gt = valid & (key > threshold)
        eq = valid & (key == threshold)
        both = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)  # inclusive
        eq_upto = n_eq + (both >> 16)
        sel = gt | (eq & (eq_upto <= need_eq))
        dst = n_gt + (both & 0xFFFF) + tl.minimum(eq_upto, need_eq) - 1
        val = pos
        if TO_SLOTS:
            page = tl.load(block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt
                           + pos // page_size, mask=sel, other=0)
            val = page * page_size + pos % page_size
        tl.store(out_row + dst, val, mask=sel & (dst < k))
        n_gt += tl.sum(gt.to(tl.int32), axis=0)
        n_eq += tl.sum(eq.to(tl.int32), axis=0)
    # --- pad -------------------------------------------------------------------------------------
    n_out = n_gt + tl.minimum(n_eq, need_eq)
    offs = tl.arange(0, BLOCK)
    for s0 in range(0, k, BLOCK):
        o = s0 + offs
        tl.store(out_row + o, tl.full((BLOCK,), -1, tl.int32), mask=(o >= n_out) & (o < k))
