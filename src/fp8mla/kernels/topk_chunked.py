"""Top-k over long rows with several programs per row: the radix select of
`fp8mla.kernels.topk`, one launch per 4-bit digit, each row cut into chunks of CHUNK logits.

Per row a small int32 workspace ``ws`` [rows, WS_WORDS] (zeroed before the first launch):
state (prefix bits, shift, k_rem, settled, n_valid), a 32-bin histogram and a ticket.

- `_topk_pass_kernel` (grid rows × chunks, one launch per digit): every program of a row adds
  its chunk's digit histogram into the row's (atomics) and takes a ticket; the last one chooses
  the digit, updates the state and clears the histogram and the ticket for the next launch.
  Once a row's prefix has settled (or its 32 bits are found) its programs return at once.
- `_topk_count_kernel`: per chunk, the keys above and at the final prefix.
- `_topk_emit_kernel`: each chunk's ranks start after the counts of the chunks before it
  (positions stay in ascending order, ties lowest-positioned first); the last chunk pads.

Memory: rows · (WS_WORDS + 2 · chunks) int32 — 24 KB for 64 rows of 128K. Graph-safe (no host
synchronisation); the launches' kernel boundaries order the passes.
"""

import triton
import triton.language as tl

from fp8mla.kernels.topk import (
    DIGIT_BITS,
    _above_at,
    _choose_digit,
    _digit_hist,
    _emit,
    _load_keys,
    _pad,
)

WS_WORDS = tl.constexpr(48)  # [0:5] state, [8:40] histogram, [40] ticket
ST_PREFIX = tl.constexpr(0)
ST_SHIFT = tl.constexpr(1)
ST_KREM = tl.constexpr(2)
ST_SETTLED = tl.constexpr(3)
ST_NVALID = tl.constexpr(4)
HIST = tl.constexpr(8)
TICKET = tl.constexpr(40)


@triton.jit
def _topk_pass_kernel(logits_ptr, length_ptr, ws_ptr, stride_lr, k, num_cols, num_chunks,
                      FIRST: tl.constexpr, CHUNK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    if FIRST:
        prefix = tl.zeros((), tl.uint32)
        shift = 32
        k_rem = k
        settled = 0
    else:
        prefix = tl.load(ws + ST_PREFIX).to(tl.uint32, bitcast=True)
        shift = tl.load(ws + ST_SHIFT)
        k_rem = tl.load(ws + ST_KREM)
        settled = tl.load(ws + ST_SETTLED)
    if (settled == 0) & (shift > 0):
        shift -= DIGIT_BITS
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        row = logits_ptr + r.to(tl.int64) * stride_lr
        pos, valid, key = _load_keys(row, c * CHUNK, length, CHUNK)
        bins = tl.arange(0, 32)
        tl.atomic_add(ws + HIST + bins, _digit_hist(valid, key, prefix, shift), sem="release")
        tl.debug_barrier()  # every thread's histogram update precedes the ticket
        if tl.atomic_add(ws + TICKET, 1, sem="acq_rel") == num_chunks - 1:
            hist = tl.atomic_xchg(ws + HIST + bins, tl.zeros((32,), tl.int32), sem="acquire")
            total, d, above, at_d = _choose_digit(hist, k_rem)
            if FIRST:
                tl.store(ws + ST_NVALID, total)
            k_rem = k_rem - above
            prefix = (prefix << DIGIT_BITS) | d.to(tl.uint32)
            tl.store(ws + ST_PREFIX, prefix.to(tl.int32, bitcast=True))
            tl.store(ws + ST_SHIFT, shift)
            tl.store(ws + ST_KREM, k_rem)
            tl.store(ws + ST_SETTLED, (at_d == k_rem).to(tl.int32))
            tl.atomic_xchg(ws + TICKET, 0, sem="release")


@triton.jit
def _final_prefix(ws, k):
    """(prefix, shift, keys at the prefix that belong to the top k); all valid keys when the
    row has no more than k (every valid key is above the 0 prefix)."""
    take_all = tl.load(ws + ST_NVALID) <= k
    prefix = tl.where(take_all, 0, tl.load(ws + ST_PREFIX)).to(tl.uint32, bitcast=True)
    shift = tl.where(take_all, 0, tl.load(ws + ST_SHIFT))
    need_eq = tl.where(take_all, 0, tl.load(ws + ST_KREM))
    return prefix, shift, need_eq


@triton.jit
def _topk_count_kernel(logits_ptr, length_ptr, ws_ptr, counts_ptr, stride_lr, k, num_cols,
                       num_chunks, CHUNK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    prefix, shift, need_eq = _final_prefix(ws_ptr + r.to(tl.int64) * WS_WORDS, k)
    length = tl.minimum(tl.load(length_ptr + r), num_cols)
    pos, valid, key = _load_keys(logits_ptr + r.to(tl.int64) * stride_lr, c * CHUNK, length,
                                 CHUNK)
    gt, eq = _above_at(valid, key, shift, prefix)
    at = counts_ptr + (r.to(tl.int64) * num_chunks + c) * 2
    tl.store(at, tl.sum(gt.to(tl.int32), axis=0))
    tl.store(at + 1, tl.sum(eq.to(tl.int32), axis=0))


@triton.jit
def _topk_emit_kernel(logits_ptr, out_ptr, block_table_ptr, length_ptr, ws_ptr, counts_ptr,
                      stride_lr, stride_or, stride_bt, k, page_size, num_cols, num_chunks,
                      CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr, ROWS_PER_REQ: tl.constexpr,
                      TO_SLOTS: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    prefix, shift, need_eq = _final_prefix(ws_ptr + r.to(tl.int64) * WS_WORDS, k)
    offs_c = tl.arange(0, CHUNKS_P2)
    counts = counts_ptr + r.to(tl.int64) * num_chunks * 2 + offs_c * 2
    gt = tl.load(counts, mask=offs_c < num_chunks, other=0)
    eq = tl.load(counts + 1, mask=offs_c < num_chunks, other=0)
    length = tl.minimum(tl.load(length_ptr + r), num_cols)
    pos, valid, key = _load_keys(logits_ptr + r.to(tl.int64) * stride_lr, c * CHUNK, length,
                                 CHUNK)
    out_row = out_ptr + r.to(tl.int64) * stride_or
    bt_row = block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt
    _emit(out_row, bt_row, pos, valid, key, shift, prefix, need_eq,
          tl.sum(tl.where(offs_c < c, gt, 0), axis=0), tl.sum(tl.where(offs_c < c, eq, 0), axis=0),
          k, page_size, TO_SLOTS)
    if c == num_chunks - 1:  # pad after every chunk's selections
        _pad(out_row, tl.sum(gt, axis=0) + tl.minimum(tl.sum(eq, axis=0), need_eq), k, CHUNK)
