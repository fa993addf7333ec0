"""Exact top-k per row by radix select (k up to a few thousand, rows of any length).

Keys: float32 logits mapped to order-preserving uint32 (flip all bits of negatives, the sign bit
of the rest; −0 as +0); −inf and NaN are never candidates. Passes find the k-th largest key's
bits four at a time (a 16-bin histogram of the next digit among keys matching the digits found
so far; 4-bit digits keep the warp-ballot histogram at ~10 instructions per key, 8-bit ones cost
~90) and stop once every key with the prefix found belongs to the top k, or the row has no more
than k candidates: 2–4 passes on 4K rows of distinct logits, 5–7 on 32K ones, all 8 when ties
reach the last digit. A last pass, in position order, emits every
position whose key is above the prefix and the lowest-positioned ones that match it until k are
taken (one prefix scan of both counts packed into an int32). Output positions are in ascending
order; a row with fewer than k candidates emits them all and pads with −1. Optionally each
position p of row r is mapped to its physical slot
block_table[r // ROWS_PER_REQ, p // page_size] · page_size + p % page_size (−1 where a
block-table entry is negative or the slot would pass the int32 range; a slot past the pool
is emitted as computed, and the sparse kernels skip it). ONE_BLOCK
(row ≤ BLOCK + TAIL): the row is loaded once and every pass works on registers (a row just past
a power of two, e.g. 4160, takes a 4096 block and a small tail, not an 8192 block); otherwise
each pass re-reads it in BLOCK steps (from L2 when it fits). Nothing is allocated per row.
"""

import triton
import triton.language as tl

DIGIT_BITS = tl.constexpr(4)
NO_MATCH = tl.constexpr(16)  # histogram bin of elements outside the prefix found so far


@triton.jit
def _load_keys(row, s0, length, BLOCK: tl.constexpr, GATHER: tl.constexpr = False):
    """Positions, validity and order-preserving uint32 keys of row[s0 : s0 + BLOCK] (GATHER:
    s0 is a [BLOCK] tensor of positions)."""
    if GATHER:
        pos = s0
    else:
        pos = s0 + tl.arange(0, BLOCK)
    x = tl.load(row + pos, mask=pos < length, other=float("-inf"))
    valid = (pos < length) & (x > float("-inf")) & (x == x)
    bits = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))  # −0 ties with +0, as in torch
    flipped = tl.where(bits < 0, ~bits, bits | (-2147483648))
    return pos, valid, flipped.to(tl.uint32, bitcast=True)


@triton.jit
def _digit_hist(valid, key, prefix, shift):
    """16-bin histogram of key's 4-bit digit at ``shift`` among keys whose higher bits equal
    prefix (bin NO_MATCH counts the rest). The higher bits are key >> (shift + 4), taken in two
    shifts: a 32-bit shift (the first digit, no prefix yet) is undefined, 31 then 1 is 0."""
    match = valid & (((key >> (shift + 3)) >> 1) == prefix)
    digit = tl.where(match, (key >> shift) & 15, NO_MATCH).to(tl.int32)
    return tl.histogram(digit, 32)


@triton.jit
def _digit_hist_masked(valid, key, prefix, shift, BITS: tl.constexpr, BINS: tl.constexpr):
    """_digit_hist for BITS-bit digits: BINS = 2^BITS bins, the keys outside the prefix masked
    out (no extra bin: at 8 bits that would double the warp-ballot histogram's bins)."""
    match = valid & (((key >> (shift + BITS - 1)) >> 1) == prefix)
    digit = ((key >> shift) & (BINS - 1)).to(tl.int32)
    return tl.histogram(digit, BINS, mask=match)


@triton.jit
def _choose_digit(hist, k_rem, BINS: tl.constexpr = 32, DIGITS: tl.constexpr = NO_MATCH):
    """From a digit histogram [BINS] whose first DIGITS bins count the digits (the rest, e.g.
    NO_MATCH, ignored): (keys counted, the digit d of the k_rem-th largest, keys above digit d,
    keys at digit d)."""
    bins = tl.arange(0, BINS)
    hist = tl.where(bins < DIGITS, hist, 0)
    total = tl.sum(hist, axis=0)
    # keys with digit >= d; the k-th largest has the highest d where that reaches k_rem.
    # at_or_above falls with d, so the keys above that digit are the largest count below
    # k_rem, and the keys at it the smallest count reaching k_rem minus those above.
    at_or_above = total - tl.cumsum(hist, axis=0) + hist
    reach = (at_or_above >= k_rem) & (bins < DIGITS)
    d = tl.max(tl.where(reach, bins, 0), axis=0)
    above = tl.max(tl.where(reach, 0, at_or_above), axis=0)
    at_d = tl.min(tl.where(reach, at_or_above, 2147483647), axis=0) - above
    return total, d, above, at_d


@triton.jit
def _next_digit(hist, k_rem, prefix, n_valid, first, need, BITS: tl.constexpr,
                BINS: tl.constexpr = 32, DIGITS: tl.constexpr = NO_MATCH):
    """One digit of the radix select from its histogram (`_choose_digit`): the digit of the
    k_rem-th largest key appended to prefix, the keys still needed at the new prefix, n_valid
    (the keys counted, taken when ``first``: the first digit counts every valid key), and
    whether the select has settled — every key at the new prefix needed, or no more than
    ``need`` valid keys (all taken). Returns (k_rem, prefix, n_valid, settled, keys at d)."""
    total, d, above, at_d = _choose_digit(hist, k_rem, BINS, DIGITS)
    n_valid = tl.where(first, total, n_valid)
    k_rem = k_rem - above
    prefix = (prefix << BITS) | d.to(tl.uint32)
    settled = ((at_d == k_rem) | (n_valid <= need)).to(tl.int32)
    return k_rem, prefix, n_valid, settled, at_d


@triton.jit
def _above_at(valid, key, shift, prefix):
    """Masks of the valid keys whose bits above ``shift`` are above / equal to prefix."""
    high = key >> shift
    return valid & (high > prefix), valid & (high == prefix)


@triton.jit
def _pad(out_row, n_out, k, BLOCK: tl.constexpr):
    """−1 in out_row[n_out:k]."""
    for s0 in range(0, k, BLOCK):
        o = s0 + tl.arange(0, BLOCK)
        tl.store(out_row + o, tl.full((BLOCK,), -1, tl.int32), mask=(o >= n_out) & (o < k))


@triton.jit
def _emit(out_row, bt_row, pos, valid, key, shift, prefix, need_eq, n_gt, n_eq, k, page_size,
          pos_map, TO_SLOTS: tl.constexpr, MAPPED: tl.constexpr):
    """Store this block's selected positions (or slots) at their ranks; returns the running
    counts of keys above / matching the prefix. MAPPED: the keys are a compacted copy and
    pos_map[i] holds the row position of key i."""
    gt, eq = _above_at(valid, key, shift, prefix)
    both = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)  # inclusive
    eq_upto = n_eq + (both >> 16)
    sel = gt | (eq & (eq_upto <= need_eq))
    dst = n_gt + (both & 0xFFFF) + tl.minimum(eq_upto, need_eq) - 1
    val = pos
    if MAPPED:
        val = tl.load(pos_map + pos, mask=sel, other=0)
    if TO_SLOTS:  # (int64: a page past the int32 slot range becomes −1, never a wrapped slot)
        page = tl.load(bt_row + val // page_size, mask=sel, other=0).to(tl.int64)
        slot = page * page_size + val % page_size
        val = tl.where((slot >= 0) & (slot < 2**31), slot, -1).to(tl.int32)
    tl.store(out_row + dst, val, mask=sel & (dst < k))
    return n_gt + tl.sum(gt.to(tl.int32), axis=0), n_eq + tl.sum(eq.to(tl.int32), axis=0)


@triton.jit
def _select_row(row, length, out_row, bt_row, pos_map, k, page_size, prefix, shift, k_rem,
                settled, n_valid, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr,
                TAIL: tl.constexpr, TO_SLOTS: tl.constexpr, MAPPED: tl.constexpr,
                base=0, OFFSET: tl.constexpr = False):
    """The top k of row[:length] into out_row (see the module docstring), the radix select
    starting from (prefix, shift, k_rem, settled, n_valid) — (0, 32, k, 0, 0) from scratch, or a
    state found by earlier passes over a longer row whose candidates this row holds; MAPPED: row
    is a compacted copy whose key i sits at position pos_map[i] of the original row. OFFSET
    (ONE_BLOCK): every valid key is > base and the digits count from key − base (so a select
    over keys in a narrow range can start at a low shift; > base, not ≥: with ≤ k valid keys
    all are taken as the keys above 0). (8-bit
    digits here — half the passes over a compacted row of 4096 — measured slower on the H200:
    finish 16.8 → 19.6 µs, h200-20261129-s7-topk-profile-wide.json.)"""
    if ONE_BLOCK:  # the row in registers: BLOCK keys, then TAIL more (0: none)
        pos1, valid1, key1 = _load_keys(row, 0, length, BLOCK)
        if OFFSET:
            key1 = key1 - base
        if TAIL > 0:
            pos2, valid2, key2 = _load_keys(row, BLOCK, length, TAIL)

    # --- radix select, one 4-bit digit per pass, down to the prefix P that the k-th largest key
    # shares with exactly the keys still needed (then every key with prefix P is taken) ------
    # shift: bits below the prefix; k_rem: keys still needed among those matching the prefix
    while (shift > 0) & (settled == 0):
        shift -= DIGIT_BITS
        if ONE_BLOCK:
            hist = _digit_hist(valid1, key1, prefix, shift)
            if TAIL > 0:
                hist += _digit_hist(valid2, key2, prefix, shift)
        else:
            hist = tl.zeros((32,), tl.int32)
            for s0 in range(0, length, BLOCK):
                pos, valid, key = _load_keys(row, s0, length, BLOCK)
                hist += _digit_hist(valid, key, prefix, shift)
        # ≤ k candidates: all of them
        k_rem, prefix, n_valid, settled, _ = _next_digit(hist, k_rem, prefix, n_valid,
                                                         shift == 32 - DIGIT_BITS, k,
                                                         DIGIT_BITS)
    # fewer than k candidates: all of them (every valid key's prefix is above the 0 prefix)
    take_all = n_valid <= k
    prefix = tl.where(take_all, 0, prefix)
    shift = tl.where(take_all, 0, shift)
    need_eq = tl.where(take_all, 0, k_rem)  # keys with the prefix that are in the top k

    # --- emit positions in order: rank = (# above so far) + min(# equal so far, need_eq) ------
    n_gt = 0
    n_eq = 0
    if ONE_BLOCK:
        n_gt, n_eq = _emit(out_row, bt_row, pos1, valid1, key1, shift, prefix, need_eq, n_gt,
                           n_eq, k, page_size, pos_map, TO_SLOTS, MAPPED)
        if TAIL > 0:
            n_gt, n_eq = _emit(out_row, bt_row, pos2, valid2, key2, shift, prefix, need_eq,
                               n_gt, n_eq, k, page_size, pos_map, TO_SLOTS, MAPPED)
    else:
        for s0 in range(0, length, BLOCK):
            pos, valid, key = _load_keys(row, s0, length, BLOCK)
            n_gt, n_eq = _emit(out_row, bt_row, pos, valid, key, shift, prefix, need_eq, n_gt,
                               n_eq, k, page_size, pos_map, TO_SLOTS, MAPPED)
    # --- pad -------------------------------------------------------------------------------------
    _pad(out_row, n_gt + tl.minimum(n_eq, need_eq), k, BLOCK)


@triton.jit
def _topk_kernel(
    logits_ptr, out_ptr, block_table_ptr, length_ptr,
    stride_lr, stride_or, stride_bt, k, page_size, num_cols,
    BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr, TAIL: tl.constexpr,
    ROWS_PER_REQ: tl.constexpr, TO_SLOTS: tl.constexpr,
):
    r = tl.program_id(0)
    _select_row(logits_ptr + r.to(tl.int64) * stride_lr,
                tl.minimum(tl.load(length_ptr + r), num_cols),  # never past the row
                out_ptr + r.to(tl.int64) * stride_or,
                block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt, out_ptr, k,
                page_size, tl.zeros((), tl.uint32), tl.full((), 32, tl.int32),
                tl.full((), k, tl.int32), tl.zeros((), tl.int32), tl.zeros((), tl.int32), BLOCK,
                ONE_BLOCK, TAIL, TO_SLOTS, False)
