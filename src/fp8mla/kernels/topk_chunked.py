"""Top-k over long rows with several programs per row: a threshold that keeps a superset of
each row's top k, the keys above it compacted, and the radix select of `fp8mla.kernels.topk`
finished on those few candidates in one program per row. Three to four launches, whatever
the data:

1. The threshold, one of two ways (the launcher picks by row length, `fp8mla.topk.sampled`):
   - `_topk_sample_kernel` (one program per row; rows ≤ 16 k logits): SAMPLES logits, one per
     stratum of the row, and T = the 16-bit bin floor of the r-th largest valid sample, r set so
     that the keys ≥ T are expected to number (k + CAP) / 2 — k and CAP then lie over 5
     standard deviations away (B=64 × 32K: 10 µs, where two digit passes take 27).
   - `_topk_pass_kernel` (grid rows × chunks), PASSES times: every program adds its chunk's
     histogram of the next PASS_BITS-bit digit (among keys matching the digits found so far)
     into the row's (atomics) and takes a ticket; the last one chooses the digit, updates the
     state and the row's candidate count (keys above or at the prefix: a superset of its top
     k), and clears the histogram and the ticket. Settled rows' programs return at once. Two
     8-bit digits (sign, exponent, 7 mantissa bits) leave tens to hundreds of candidates beyond
     the top k on rows of distinct logits; an 8-bit digit's histogram costs ~1.5× a 4-bit
     one's instructions per key (warp ballots), and a pass is mostly launch and ticket latency.
2. `_topk_compact_kernel` (rows × chunks): each chunk copies its candidates (value and
   position, in position order) to a run of the row's compact buffer claimed with one atomic
   add, and records (run start, length). After digit passes only rows whose candidate count
   fits CAP compact; after a sample every row does (stores past CAP dropped), counting what it
   keeps and every valid key.
3. `_topk_finish_kernel` (one program per row): a compacted row puts the runs back in chunk
   order (position order) in place, then `_select_row` runs over ≤ CAP keys in registers —
   going on from the passes' digits, or after a sample from scratch with the digits counted
   from T (every candidate lies in [T, max], so they start at the span's top bit). A row
   whose candidates exceed CAP (thousands of keys tied at the prefix) or, after a sample, fall
   short of k (and of the row's valid keys) finishes over the whole row in this one program,
   CAP keys per step (slower, exact).

Per row a small int32 workspace ``ws`` [rows, WS_WORDS] holds the state (prefix bits, shift,
k_rem, settled, n_valid, candidates, the compaction cursor), a histogram and a ticket (zeroed
before the passes; the sample kernel sets what the later steps read); ``runs`` [rows, chunks,
2] the compacted runs. Memory: rows · (WS_WORDS + 2 · chunks + 2 · CAP) 32-bit words —
independent of row length beyond the runs. Graph-safe (no host synchronisation); the launches'
kernel boundaries order the steps.
"""

import triton
import triton.language as tl

from fp8mla.kernels.topk import (
    DIGIT_BITS,
    _above_at,
    _digit_hist,
    _digit_hist_masked,
    _load_keys,
    _next_digit,
    _select_row,
)

PASS_BITS = tl.constexpr(8)
PASS_BINS = tl.constexpr(256)
WS_WORDS = tl.constexpr(272)  # [0:8] state, [8:264] histogram, [264] ticket
ST_PREFIX = tl.constexpr(0)
ST_SHIFT = tl.constexpr(1)
ST_KREM = tl.constexpr(2)
ST_SETTLED = tl.constexpr(3)
ST_NVALID = tl.constexpr(4)
ST_CAND = tl.constexpr(5)  # keys above or at the prefix (all valid keys when ≤ k of them)
ST_CURSOR = tl.constexpr(6)  # compact buffer words claimed so far
HIST = tl.constexpr(8)
TICKET = tl.constexpr(264)


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
    if settled == 0:
        shift -= PASS_BITS
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        pos, valid, key = _load_keys(logits_ptr + r.to(tl.int64) * stride_lr, c * CHUNK,
                                     length, CHUNK)
        bins = tl.arange(0, PASS_BINS)
        hist = _digit_hist_masked(valid, key, prefix, shift, PASS_BITS, PASS_BINS)
        tl.atomic_add(ws + HIST + bins, hist, mask=hist > 0, sem="release")
        tl.debug_barrier()  # every thread's histogram update precedes the ticket
        if tl.atomic_add(ws + TICKET, 1, sem="acq_rel") == num_chunks - 1:
            hist = tl.atomic_xchg(ws + HIST + bins, tl.zeros_like(bins), sem="acquire")
            if FIRST:
                n_valid = tl.zeros((), tl.int32)
            else:
                n_valid = tl.load(ws + ST_NVALID)
            # rows with no more than k candidates take them all: nothing to find
            k_rem, prefix, n_valid, settled, at_d = _next_digit(
                hist, k_rem, prefix, n_valid, FIRST, k, PASS_BITS, PASS_BINS, PASS_BINS)
            if FIRST:
                tl.store(ws + ST_NVALID, n_valid)
            tl.store(ws + ST_PREFIX, prefix.to(tl.int32, bitcast=True))
            tl.store(ws + ST_SHIFT, shift)
            tl.store(ws + ST_KREM, k_rem)
            tl.store(ws + ST_SETTLED, settled)
            # keys above the new prefix: all in the top k (k − k_rem of them); plus those at it
            tl.store(ws + ST_CAND, tl.where(n_valid <= k, n_valid, k - k_rem + at_d))
            tl.atomic_xchg(ws + TICKET, 0, sem="release")


@triton.jit
def _topk_sample_kernel(logits_ptr, length_ptr, ws_ptr, stride_lr, k, num_cols,
                        CAP: tl.constexpr, SAMPLES: tl.constexpr):
    """A threshold T per row from SAMPLES of its logits, one per stratum of length / SAMPLES
    positions (at a hashed offset inside it): T is the 16-bit bin floor of the r-th largest
    valid sample, r chosen so that the row's keys ≥ T are expected to number (k + CAP) / 2;
    T = 0 (every valid key) when the row has no more than CAP positions or too few valid
    samples. Stored as the prefix at shift 0; the compaction counts what T really keeps."""
    r = tl.program_id(0)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    length = tl.minimum(tl.load(length_ptr + r), num_cols)
    threshold = tl.zeros((), tl.uint32)
    if length > CAP:
        i = tl.arange(0, SAMPLES).to(tl.int64)
        lo = i * length // SAMPLES
        # strata of length / SAMPLES positions (0 or 1 when the row is shorter than SAMPLES:
        # each position then sampled about equally often)
        width = tl.maximum((i + 1) * length // SAMPLES - lo, 1)
        mix = (i * 40503 + 12345) % 65521  # an offset inside the stratum that is not periodic
        pos, valid, key = _load_keys(logits_ptr + r.to(tl.int64) * stride_lr, lo + mix % width,
                                     length, SAMPLES, True)
        rank = (SAMPLES * (k + CAP) + 2 * length - 1) // (2 * length)
        prefix = tl.zeros((), tl.uint32)
        shift = 32
        k_rem = rank
        settled = 0
        n_valid = 0
        while (shift > 16) & (settled == 0):
            shift -= DIGIT_BITS
            k_rem, prefix, n_valid, settled, _ = _next_digit(
                _digit_hist(valid, key, prefix, shift), k_rem, prefix, n_valid,
                shift == 32 - DIGIT_BITS, rank, DIGIT_BITS)
        threshold = tl.where(n_valid <= rank, 0, prefix << shift)
    tl.store(ws + ST_PREFIX, threshold.to(tl.int32, bitcast=True))
    tl.store(ws + ST_CAND, 0)  # the workspace is not zeroed first: what the next steps read
    tl.store(ws + ST_CURSOR, 0)
    tl.store(ws + ST_NVALID, 0)


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
def _topk_compact_kernel(logits_ptr, length_ptr, ws_ptr, runs_ptr, cval_ptr, cpos_ptr,
                         stride_lr, k, num_cols, num_chunks, CAP: tl.constexpr,
                         CHUNK: tl.constexpr, SAMPLED: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    # digit passes: the candidate count is known (compact only what fits); a sampled
    # threshold (ST_CAND stays 0): count while compacting — the finish checks the count, so
    # every valid key is counted too
    if tl.load(ws + ST_CAND) <= CAP:
        if SAMPLED:
            prefix = tl.load(ws + ST_PREFIX).to(tl.uint32, bitcast=True)
            shift = 0
        else:
            prefix, shift, need_eq = _prefix_state(ws, k)
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        row = logits_ptr + r.to(tl.int64) * stride_lr
        pos, valid, key = _load_keys(row, c * CHUNK, length, CHUNK)
        above, at = _above_at(valid, key, shift, prefix)
        take = above | at
        n = tl.sum(take.to(tl.int32), axis=0)
        start = tl.atomic_add(ws + ST_CURSOR, n, sem="relaxed")  # this chunk's run
        if SAMPLED:
            tl.atomic_add(ws + ST_NVALID, tl.sum(valid.to(tl.int32), axis=0), sem="relaxed")
        at_run = start + tl.cumsum(take.to(tl.int32), axis=0) - 1
        take = take & (at_run < CAP)  # a sampled threshold may keep more than fit
        dst = r.to(tl.int64) * CAP + at_run
        tl.store(cval_ptr + dst, tl.load(row + pos, mask=take), mask=take)
        tl.store(cpos_ptr + dst, pos, mask=take)
        run = runs_ptr + (r.to(tl.int64) * num_chunks + c) * 2
        tl.store(run, start)
        tl.store(run + 1, n)


@triton.jit
def _order_runs(cval, cpos, runs, num_chunks, n_cand, CAP: tl.constexpr,
                CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """Move the compacted runs (claimed in any order) into chunk order, in place: candidate j
    of chunk c's run goes to (the runs of chunks before c) + j − (its run's start). The
    positions say each candidate's chunk; every load precedes the barrier, every store
    follows it."""
    offs_c = tl.arange(0, CHUNKS_P2)
    start = tl.load(runs + 2 * offs_c, mask=offs_c < num_chunks, other=0)
    n = tl.load(runs + 2 * offs_c + 1, mask=offs_c < num_chunks, other=0)
    shift = tl.cumsum(n, axis=0) - n - start  # ordered index − claimed index, per chunk
    tl.store(runs + 2 * offs_c, shift, mask=offs_c < num_chunks)
    tl.debug_barrier()
    j = tl.arange(0, CAP)
    ok = j < n_cand
    val = tl.load(cval + j, mask=ok)
    pos = tl.load(cpos + j, mask=ok, other=0)
    dst = j + tl.load(runs + 2 * (pos // CHUNK), mask=ok, other=0)
    tl.debug_barrier()
    tl.store(cval + dst, val, mask=ok)
    tl.store(cpos + dst, pos, mask=ok)
    tl.debug_barrier()


@triton.jit
def _topk_finish_kernel(logits_ptr, length_ptr, cval_ptr, cpos_ptr, runs_ptr, out_ptr,
                        block_table_ptr, ws_ptr, stride_lr, stride_or, stride_bt, k, page_size,
                        num_cols, num_chunks, CAP: tl.constexpr, CHUNK: tl.constexpr,
                        CHUNKS_P2: tl.constexpr, ROWS_PER_REQ: tl.constexpr,
                        TO_SLOTS: tl.constexpr, SAMPLED: tl.constexpr):
    r = tl.program_id(0)
    ws = ws_ptr + r.to(tl.int64) * WS_WORDS
    out_row = out_ptr + r.to(tl.int64) * stride_or
    bt_row = block_table_ptr + (r // ROWS_PER_REQ).to(tl.int64) * stride_bt
    if SAMPLED:  # the select starts from scratch over the candidates (or the row)
        n_cand = tl.load(ws + ST_CURSOR)
        # the candidates hold the top k: at least k of them, or every valid key
        ok = (n_cand <= CAP) & ((n_cand >= k) | (n_cand == tl.load(ws + ST_NVALID)))
        prefix = tl.zeros((), tl.uint32)
        shift = tl.full((), 32, tl.int32)
        k_rem = tl.full((), k, tl.int32)
        settled = tl.zeros((), tl.int32)
        n_valid = tl.zeros((), tl.int32)
    else:  # going on from the digits the passes found
        n_cand = tl.load(ws + ST_CAND)
        ok = n_cand <= CAP
        prefix = tl.load(ws + ST_PREFIX).to(tl.uint32, bitcast=True)
        shift = tl.load(ws + ST_SHIFT)
        k_rem = tl.load(ws + ST_KREM)
        settled = tl.load(ws + ST_SETTLED)
        n_valid = tl.load(ws + ST_NVALID)
    if ok:
        cval = cval_ptr + r.to(tl.int64) * CAP
        cpos = cpos_ptr + r.to(tl.int64) * CAP
        _order_runs(cval, cpos, runs_ptr + r.to(tl.int64) * num_chunks * 2, num_chunks, n_cand,
                    CAP, CHUNK, CHUNKS_P2)
        base = tl.zeros((), tl.uint32)
        if SAMPLED:
            # every candidate lies in [T, the largest]: counted from T − 1, all share the bits
            # above the span's top bit, so the digits start there (distinct normal logits:
            # ~24 bits, two 4-bit digits fewer). From T − 1, not T: every offset key stays ≥ 1,
            # as `_select_row`'s take-all case (≤ k candidates: keys above 0) requires. The
            # float conversion may round the span up a power of two: one bit more, never fewer.
            base = tl.maximum(tl.load(ws + ST_PREFIX).to(tl.uint32, bitcast=True), 1) - 1
            _, valid, key = _load_keys(cval, 0, n_cand, CAP)
            span = (tl.max(tl.where(valid, key, base), axis=0) - base).to(tl.float32)
            bits = (span.to(tl.int32, bitcast=True) >> 23) - 126  # 32 - leading zeros; 0 → −126
            shift = tl.minimum(tl.maximum(bits + 3, 0) // DIGIT_BITS * DIGIT_BITS, 32)
            n_valid = n_cand  # the first digit would have counted them
        _select_row(cval, n_cand, out_row, bt_row, cpos, k, page_size, prefix, shift, k_rem,
                    settled, n_valid, CAP, True, 0, TO_SLOTS, True, base, SAMPLED)
    else:  # ties overflow the buffer (or an unlucky sample): the whole row, CAP keys a step
        length = tl.minimum(tl.load(length_ptr + r), num_cols)
        _select_row(logits_ptr + r.to(tl.int64) * stride_lr, length, out_row, bt_row, out_row,
                    k, page_size, prefix, shift, k_rem, settled, n_valid, CAP, False, 0,
                    TO_SLOTS, False)
