"""Top-k over long rows with several programs per row: the radix select of
`fp8mla.kernels.topk`, one launch per 4-bit digit, each row cut into chunks of CHUNK logits.

Per row a small int32 workspace ``ws`` [rows, WS_WORDS] (zeroed before the first launch):
state (prefix bits, shift, k_rem, settled, n_valid, compacted), a 32-bin histogram and a ticket.

- `_topk_pass_kernel` (grid rows × chunks, one launch per digit): every program of a row adds
  its chunk's digit histogram into the row's (atomics) and takes a ticket; the last one chooses
  the digit, updates the state and clears the histogram and the ticket for the next launch.
  Once a row's prefix has settled (or its 32 bits are found, or the row was compacted) its
  programs return at once.
- `_topk_count_kernel`: per chunk, the keys above and at the prefix found so far.
- `_topk_compact_kernel` (after COMPACT_AFTER digit passes): when a row's candidates — keys
  above or at the prefix, a superset of its top k — fit CAP, each chunk copies its candidates
  (value and position, in position order) to the row's compact buffer at the offset of the
  counts before it, and the row is marked compacted; `_topk_select_compacted_kernel` then
  finishes the row in one program on registers (`_select_row` over ≤ CAP keys, going on from
  the digits already found). A digit pass costs the same whether 10 or all of a chunk's keys
  match the prefix (H200: ≈ 9 µs per 2M keys), and distinct logits need ~6 of the 8 digits to
  settle (2–4 on a 4K row, 5–7 on a 32K one); after 4 (16 bits) tens to hundreds of
  candidates beyond the top k remain on 128K rows of normally distributed logits.
- Rows whose candidates exceed CAP (heavy ties) go on: the remaining digit passes, then
  `_topk_count_kernel` and `_topk_emit_kernel` — each chunk's ranks start after the counts of
  the chunks before it (positions stay in ascending order, ties lowest-positioned first); the
  last chunk pads. Compacted rows return at once from these.

Memory: rows · (WS_WORDS + 2 · chunks + 2 · CAP) 32-bit words — independent of row length
beyond the chunk counts. Graph-safe (no host synchronisation); the launches' kernel boundaries
order the passes.
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
    _select_row,
)

WS_WORDS = tl.constexpr(48)  # [0:6] state, [8:40] histogram, [40] ticket
ST_PREFIX = tl.constexpr(0)
ST_SHIFT = tl.constexpr(1)
ST_KREM = tl.constexpr(2)
ST_SETTLED = tl.constexpr(3)
ST_NVALID = tl.constexpr(4)
ST_COMPACT = tl.constexpr(5)  # 0: not compacted; else 1 + the compacted candidates
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
        settled = tl.load(ws + ST_SETTLED) | tl.load(ws + ST_COMPACT)
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
            if FIRST:  # rows with no more than k candidates take them all: nothing to find
                tl.store(ws + ST_SETTLED, ((at_d == k_rem) | (total <= k)).to(tl.int32))
            else:
                tl.store(ws + ST_SETTLED, (at_d == k_rem).to(tl.int32))
            tl.atomic_xchg(ws + TICKET, 0, sem="release")


@triton.jit
def _prefix_state(ws, k):
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
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    if tl.load(ws + ST_COMPACT) == 0:
        prefix, shift, need_eq = _prefix_state(ws, k)
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        pos, valid, key = _load_keys(logits_ptr + r.to(tl.int64) * stride_lr, c * CHUNK,
                                     length, CHUNK)
        gt, eq = _above_at(valid, key, shift, prefix)
        at = counts_ptr + (r.to(tl.int64) * num_chunks + c) * 2
        tl.store(at, tl.sum(gt.to(tl.int32), axis=0))
        tl.store(at + 1, tl.sum(eq.to(tl.int32), axis=0))


@triton.jit
def _chunk_counts(counts_ptr, r, c, num_chunks, CHUNKS_P2: tl.constexpr):
    """Per chunk of row r: keys above / at the prefix, [CHUNKS_P2] each (0 past the last
    chunk), and a mask of the chunks before chunk c."""
    offs_c = tl.arange(0, CHUNKS_P2)
    counts = counts_ptr + r.to(tl.int64) * num_chunks * 2 + offs_c * 2
    gt = tl.load(counts, mask=offs_c < num_chunks, other=0)
    eq = tl.load(counts + 1, mask=offs_c < num_chunks, other=0)
    return gt, eq, offs_c < c


@triton.jit
def _topk_compact_kernel(logits_ptr, length_ptr, ws_ptr, counts_ptr, cval_ptr, cpos_ptr,
                         stride_lr, k, num_cols, num_chunks, CAP: tl.constexpr,
                         CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    gt, eq, before = _chunk_counts(counts_ptr, r, c, num_chunks, CHUNKS_P2)
    n_cand = tl.sum(gt + eq, axis=0)
    if n_cand <= CAP:
        prefix, shift, need_eq = _prefix_state(ws, k)
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        row = logits_ptr + r.to(tl.int64) * stride_lr
        pos, valid, key = _load_keys(row, c * CHUNK, length, CHUNK)
        above, at = _above_at(valid, key, shift, prefix)
        take = above | at
        dst = r.to(tl.int64) * CAP + tl.sum(tl.where(before, gt + eq, 0), axis=0) \
            + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(cval_ptr + dst, tl.load(row + pos, mask=take), mask=take)
        tl.store(cpos_ptr + dst, pos, mask=take)
        if c == 0:
            tl.store(ws + ST_COMPACT, n_cand + 1)


@triton.jit
def _topk_select_compacted_kernel(cval_ptr, cpos_ptr, out_ptr, block_table_ptr, ws_ptr,
                                  stride_or, stride_bt, k, page_size, CAP: tl.constexpr,
                                  ROWS_PER_REQ: tl.constexpr, TO_SLOTS: tl.constexpr):
    r = tl.program_id(0)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    n_cand = tl.load(ws + ST_COMPACT) - 1
    if n_cand >= 0:  # the select goes on from the digits the passes found
        _select_row(cval_ptr + r.to(tl.int64) * CAP, n_cand, out_ptr + r.to(tl.int64) * stride_or,
                    block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt,
                    cpos_ptr + r.to(tl.int64) * CAP, k, page_size,
                    tl.load(ws + ST_PREFIX).to(tl.uint32, bitcast=True), tl.load(ws + ST_SHIFT),
                    tl.load(ws + ST_KREM), tl.load(ws + ST_SETTLED), tl.load(ws + ST_NVALID),
                    CAP, True, 0, TO_SLOTS, True)


@triton.jit
def _topk_emit_kernel(logits_ptr, out_ptr, block_table_ptr, length_ptr, ws_ptr, counts_ptr,
                      stride_lr, stride_or, stride_bt, k, page_size, num_cols, num_chunks,
                      CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr, ROWS_PER_REQ: tl.constexpr,
                      TO_SLOTS: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    if tl.load(ws + ST_COMPACT) == 0:
        prefix, shift, need_eq = _prefix_state(ws, k)
        gt, eq, before = _chunk_counts(counts_ptr, r, c, num_chunks, CHUNKS_P2)
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        pos, valid, key = _load_keys(logits_ptr + r.to(tl.int64) * stride_lr, c * CHUNK,
                                     length, CHUNK)
        out_row = out_ptr + r.to(tl.int64) * stride_or
        bt_row = block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt
        _emit(out_row, bt_row, pos, valid, key, shift, prefix, need_eq,
              tl.sum(tl.where(before, gt, 0), axis=0), tl.sum(tl.where(before, eq, 0), axis=0),
              k, page_size, out_row, TO_SLOTS, False)
        if c == num_chunks - 1:  # pad after every chunk's selections
            _pad(out_row, tl.sum(gt, axis=0) + tl.minimum(tl.sum(eq, axis=0), need_eq), k,
                 CHUNK)
