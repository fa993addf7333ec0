"""Paged absorbed-MLA decode with split-KV (docs/DESIGN.md §2) over bf16 / fp8 / fp8_ds_mla rows.

Math, per query row (one (query i, head h) pair) and token s of its request:
    score = softmax_scale · (q · kv[s]) over 576 dims;  out = Σ softmax(score) · kv[s][:512]
    lse = ln Σ exp(score).  Query i of S_Q sees s < seqlen − S_Q + 1 + i.

Grid: (batch, num_splits, head_blocks). Program (b, split, hb) takes the token chunk
``[split · chunk, (split + 1) · chunk)`` of request b (chunk from the *device* seqlen, so a CUDA
graph replays correctly when lengths change) for BLOCK_M rows = S_Q_P2 queries × HEADS heads.

The 512 latent dims are handled as four "lanes" of 128 (each a [BLOCK_N, 128] tile, one
accumulator each). For FP8 formats lane j holds dims 4c + j — byte j of the c-th 32-bit word —
so rows load as int32 words and convert with packed instructions (docs/DESIGN.md §10); for bf16 lane
j holds dims 128 j + c. q and out move as contiguous rows, split into and joined from the lanes
in registers (`_load_lanes`, `_store_lanes`). FP8 values enter fp16 MMAs (e4m3 → fp16 is
exact); bf16 rows enter bf16 MMAs.

Sparse (SPARSE=True, docs/DESIGN.md §2): each "request" is one query token (S_Q = 1) whose token
list is its row of slot indices (−1 = skip) instead of a block table, and whose length is its
topk_length; everything else is shared with dense decode. Lists compacted first
(`fp8mla.kernels.compact`, 64-row programs) run with SPARSE=False: a table of one-token pages.

TMA (dense, SM90+, pages of ≥ BLOCK_N tokens; the launcher picks it where it measured faster,
`fp8mla.runtime._tma_pays`): a split's whole tiles each lie in one page, so each is a few
tensor-memory copies (`_tma_tile` / `_fold_tile` list the descriptor boxes per format) that
Triton's pipeliner issues two tiles ahead into two buffers at 3 stages; the slot of tile i + 1
is looked up during tile i, so the copies never wait on the block table. The partial last tile
is gathered with masks, so rows past a request's end are never read. H200, fp8, B=64 × 8K, 16
heads: 164.9 → 138.9 µs; SASS per tile 1,203 → 989 instructions (no per-row address
arithmetic).

Gathered tiles (CARRY, at ≥ 3 stages): the same trick for row-by-row copies — the next tile's
slots (block table or index list) are looked up during this one, so at 3 stages Triton gives
the gathered rows two shared buffers instead of one (with the lookup in the same iteration
the index load takes the extra stage). H200: dense fp8_ds_mla B=64 × 8K × 16 heads 195 →
176 µs, bf16 172 → 163, sparse 64 heads 215 → 209–211; at 2 stages carrying was slower.
CARRY = 2 loads the entries two tiles ahead and turns them into slots one ahead, so even the
lookup's own load is not waited on in the iteration that issues it (the SASS shows the index
load ~20 instructions before its first use at CARRY 1): bf16 at 16 rows 165 → 160 µs; where
the extra carried registers add spills it is slower (`fp8mla.runtime.decode_config`).

Online softmax (LAZY, LATE_SUM; the launcher: dense FP8 at ≤ 32 rows on SM90, `_softmax_tile`):
the accumulators are rescaled only when a row's max passes the max P is taken against by more
than a factor 2⁸ — in practice on a program's first tile only — and P's row sums are kept per
tile column and summed once at the end instead of across warps every tile. The same result up
to P's fp16 rounding (taken against another max). fp16 range: P ≤ 2⁸, so the folded
fp8_ds_mla P · scale stays finite for scales ≤ 255 (the unfolded path's fp16 tile · scale: ≤
146); the software conversion's 2⁸ is applied to the output, not to P · scale. H200,
B=64 × 8K × 16 heads: fp8 135.3 → 131.2 µs, fp8_ds_mla 171.0 → 167.8; slower for 16-row
sparse programs, and 64-row (wgmma) programs spill with them.

Row layouts (fp8mla.formats): fp8 = 144 words [latent 128 | rope 16]; fp8_ds_mla = 164 words
[latent 128 | 4 float32 scales | rope as 64 bf16]; bf16 = 576 bf16.

fp8_ds_mla scales: at ≤ 16 rows per program (FOLD_SCALES) each 128-dim scale tile's scores
are scaled in float32 and its P · scale enters the P·V MMA in fp16 (rounded as P itself is);
above, the scale multiplies the fp16 tile. Precision: e4m3 → fp16 is exact, and so is a
power-of-two scale (the ``pow2`` policy: lse within ~1e-6 of the float32 reference); on the
unfolded path an ``fp32``-policy scale rounded to fp16 costs ≈ 2⁻¹⁰ relative per element (lse
errors up to ~1e-3 on the tests' data).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from fp8mla.kernels.common import mma, mma4
from fp8mla.kernels.fp8 import e4m3x4_to_f16

FMT_BF16 = tl.constexpr(0)
FMT_FP8 = tl.constexpr(1)
FMT_DS_MLA = tl.constexpr(2)
LOG2E = tl.constexpr(1.4426950408889634)
# LAZY rescale: the max that P is taken against moves only when a row's running max passes it
# by more than this (log2 units: a factor 2⁸, so P ≤ 2⁸)
RESCALE_SLACK = tl.constexpr(8.0)


@triton.jit
def _lane_dim(c, j: tl.constexpr, FP8_LAYOUT: tl.constexpr, WIDTH: tl.constexpr):
    # dimension of lane j's c-th element: interleaved bytes of words (fp8) or contiguous blocks
    if FP8_LAYOUT:
        return 4 * c + j
    else:
        return WIDTH * j + c


@triton.jit
def _load_lanes(row_ptr, row_ok, FP8_LAYOUT: tl.constexpr, WIDTH: tl.constexpr):
    """Four lanes [BLOCK_M, WIDTH] of the 4 · WIDTH values at each row_ptr (rows where row_ok,
    else 0). Lane j holds dims 4c + j (FP8_LAYOUT: the interleaved bytes of fp8 words) or
    WIDTH · j + c. The interleaved lanes are one contiguous load split in registers: loaded
    lane by lane they were 2-byte scattered loads, which took ~30 µs per 64-row program
    (H200, Nsight Compute source counters)."""
    m = row_ok[:, None]
    if FP8_LAYOUT:
        x = tl.load(row_ptr[:, None] + tl.arange(0, 4 * WIDTH)[None, :], mask=m, other=0.0)
        x = tl.reshape(x, (x.shape[0], WIDTH, 2, 2))  # dim 4c + 2p + r: lane j = 2p + r
        even, odd = tl.split(x)  # r = 0, 1
        l0, l2 = tl.split(even)
        l1, l3 = tl.split(odd)
    else:
        c = tl.arange(0, WIDTH)[None, :]
        l0 = tl.load(row_ptr[:, None] + _lane_dim(c, 0, False, WIDTH), mask=m, other=0.0)
        l1 = tl.load(row_ptr[:, None] + _lane_dim(c, 1, False, WIDTH), mask=m, other=0.0)
        l2 = tl.load(row_ptr[:, None] + _lane_dim(c, 2, False, WIDTH), mask=m, other=0.0)
        l3 = tl.load(row_ptr[:, None] + _lane_dim(c, 3, False, WIDTH), mask=m, other=0.0)
    return l0, l1, l2, l3


@triton.jit
def _store_lanes(row_ptr, row_ok, l0, l1, l2, l3, scale, FP8_LAYOUT: tl.constexpr,
                 JOIN: tl.constexpr = True):
    """`_load_lanes` reversed: lanes [BLOCK_M, WIDTH] times ``scale`` [BLOCK_M], in row_ptr's
    dtype, stored as 4 · WIDTH values per row (rows where row_ok). Interleaved lanes are joined
    in registers and stored as contiguous rows (JOIN), or stored lane by lane: scattered 2- or
    4-byte stores, but in the scale-folded kernel the join spills 80 B per thread (sm_90,
    triton 3.6) and costs more than the scatter of 16 rows. Where the joined compile spills
    instead (bf16 rows at ≤ 64 rows over fp8 rows, sm_90 / sm_100 / sm_120), joined still
    measured level with or faster than lane by lane on the H200 (up to 55 µs) wherever it
    serves by default; lane by lane won only with bf16 partials at 256 splits, where the
    default is float32 (h200-20261204-s35-a499cda-triton-lanes-ab.json)."""
    m = row_ok[:, None]
    WIDTH: tl.constexpr = l0.shape[1]
    out_t = row_ptr.dtype.element_ty
    l0 = (l0 * scale[:, None]).to(out_t)
    l1 = (l1 * scale[:, None]).to(out_t)
    l2 = (l2 * scale[:, None]).to(out_t)
    l3 = (l3 * scale[:, None]).to(out_t)
    if FP8_LAYOUT and JOIN:
        x = tl.join(tl.join(l0, l2), tl.join(l1, l3))  # [.., c, p, r] = lane 2p + r
        tl.store(row_ptr[:, None] + tl.arange(0, 4 * WIDTH)[None, :],
                 tl.reshape(x, (l0.shape[0], 4 * WIDTH)), mask=m)
    else:
        c = tl.arange(0, WIDTH)[None, :]
        tl.store(row_ptr[:, None] + _lane_dim(c, 0, FP8_LAYOUT, WIDTH), l0, mask=m)
        tl.store(row_ptr[:, None] + _lane_dim(c, 1, FP8_LAYOUT, WIDTH), l1, mask=m)
        tl.store(row_ptr[:, None] + _lane_dim(c, 2, FP8_LAYOUT, WIDTH), l2, mask=m)
        tl.store(row_ptr[:, None] + _lane_dim(c, 3, FP8_LAYOUT, WIDTH), l3, mask=m)


@triton.jit
def _tile_entries(bt_row, n0, end, page_shift, BLOCK_N: tl.constexpr, SPARSE: tl.constexpr):
    """The raw entries behind tile n0's slots, int32 [BLOCK_N]: sparse, its index-list entries
    (−1 past ``end``); dense, the block-table page of each position (0 past ``end``)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if SPARSE:
        return tl.load(bt_row + offs_n, mask=offs_n < end, other=-1)
    else:
        return tl.load(bt_row + (offs_n >> page_shift), mask=offs_n < end, other=0)


@triton.jit
def _entry_slots(raw, n0, end, page_shift, num_slots, BLOCK_N: tl.constexpr,
                 SPARSE: tl.constexpr):
    """(valid mask, int64 slots) of tile n0 from its `_tile_entries`. Sparse: −1 and slots
    outside [0, num_slots) are skipped (never read). (One unsigned compare instead of these
    three cut the sm_90 sparse 64-row loop from 1,432 to 1,315 instructions per tile but
    measured 5% slower at B=128 H=128 on the H200, 400 → 422 µs: h200-20261130-s9-*.) Dense:
    a page outside the pool reads the pool's last page (`_clamp_page`)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if SPARSE:
        mask_n = (offs_n < end) & (raw >= 0) & (raw < num_slots)
        slot = tl.where(mask_n, raw, 0).to(tl.int64)
    else:
        mask_n = offs_n < end
        slot = _page_slot(_clamp_page(raw, page_shift, num_slots).to(tl.int64), offs_n,
                          page_shift)
    return mask_n, slot


@triton.jit
def _tile_slots(bt_row, n0, end, page_shift, num_slots, BLOCK_N: tl.constexpr,
                SPARSE: tl.constexpr):
    """Entries [n0, n0 + BLOCK_N) of a request's token list: (valid mask, slots). Dense:
    position → block table → slot. Sparse: the index list holds slots; −1 and slots outside
    [0, num_slots) are skipped (never read)."""
    raw = _tile_entries(bt_row, n0, end, page_shift, BLOCK_N, SPARSE)
    return _entry_slots(raw, n0, end, page_shift, num_slots, BLOCK_N, SPARSE)


@triton.jit
def _first_slots(bt_row, n0, end, page_shift, num_slots, BLOCK_N: tl.constexpr,
                 SPARSE: tl.constexpr, CARRY: tl.constexpr):
    """What `_step_slots` carries into the gathered loop's first tile: (mask, slots) of the
    first tile (CARRY ≥ 1, else unused scalars) and the next tile's raw entries (CARRY 2,
    else an unused scalar)."""
    if CARRY >= 1:
        mask_c, slot_c = _tile_slots(bt_row, n0, end, page_shift, num_slots, BLOCK_N, SPARSE)
    else:
        mask_c, slot_c = 0, 0
    if CARRY >= 2:
        raw_c = _tile_entries(bt_row, n0 + BLOCK_N, end, page_shift, BLOCK_N, SPARSE)
    else:
        raw_c = 0
    return mask_c, slot_c, raw_c


@triton.jit
def _step_slots(bt_row, n0, end, page_shift, num_slots, mask_c, slot_c, raw_c,
                BLOCK_N: tl.constexpr, SPARSE: tl.constexpr, CARRY: tl.constexpr):
    """(mask, slots) of the gathered tile at n0, and what to carry to the next. CARRY 1 (at
    ≥ 3 stages): the tile's slots were looked up during the last tile and the next tile's are
    looked up now, so its row copies never wait on the block table or index list. CARRY 2:
    the entries are loaded two tiles ahead and turned into slots one tile ahead, so the
    lookup's own load is not waited on in the iteration that issues it."""
    if CARRY >= 2:
        mask_n, slot = _entry_slots(raw_c, n0 + BLOCK_N, end, page_shift, num_slots, BLOCK_N,
                                    SPARSE)
        raw = _tile_entries(bt_row, n0 + 2 * BLOCK_N, end, page_shift, BLOCK_N, SPARSE)
        return mask_c, slot_c, mask_n, slot, raw
    elif CARRY >= 1:
        mask_n, slot = _tile_slots(bt_row, n0 + BLOCK_N, end, page_shift, num_slots, BLOCK_N,
                                   SPARSE)
        return mask_c, slot_c, mask_n, slot, raw_c
    else:
        mask_n, slot = _tile_slots(bt_row, n0, end, page_shift, num_slots, BLOCK_N, SPARSE)
        return mask_n, slot, mask_c, slot_c, raw_c


@triton.jit
def _page_slot(page, pos, page_shift):
    """Pool row of position ``pos`` in block-table page ``page`` (its type: int32 or int64)."""
    return (page << page_shift) + (pos & ((1 << page_shift) - 1))


@triton.jit
def _clamp_page(page, page_shift, num_slots):
    """Block-table entries ``page`` moved inside the pool: a negative one or one past the pool
    (an entry only the validating path rejects) becomes its last page — one unsigned min an
    entry; masking such positions instead cost the sm_90 TMA loop 1–2% more instructions and
    the 16-row gathered loop 139 (1,301 → 1,440) and 34 registers (triton 3.9)."""
    return tl.minimum(page.to(tl.uint32), ((num_slots >> page_shift) - 1).to(tl.uint32))


@triton.jit
def _pool_row(bt_row, pos, end, page_shift, num_slots):
    """Pool row of the request's token at ``pos`` through its block table (0 from ``end`` on),
    int32: a whole tile's first row, the TMA coordinate, when tiles lie inside pages; a page
    outside the pool reads the pool's last page (`_clamp_page`)."""
    page = tl.load(bt_row + (pos >> page_shift), mask=pos < end, other=0)
    return _page_slot(_clamp_page(page, page_shift, num_slots).to(tl.int32), pos, page_shift)


@triton.jit
def _ds_rope(bf16_ptr, slot, mask_n, ROW_WORDS: tl.constexpr):
    """fp8_ds_mla rows' rope: 64 bf16 after the 128 latent words and 4 scales, [BLOCK_N, 64]."""
    return tl.load(bf16_ptr + slot[:, None] * (2 * ROW_WORDS) + 264 + tl.arange(0, 64)[None, :],
                   mask=mask_n[:, None], other=0.0)


@triton.jit
def _load_fp8_tile(u32_ptr, bf16_ptr, f32_ptr, slot, mask_n, FORMAT: tl.constexpr,
                   ROW_WORDS: tl.constexpr, WORDS_2D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Raw FP8 rows: latent words ([BLOCK_N, 128], or [BLOCK_N, 4, 32] by scale tile), scales
    (fp8_ds_mla: per word, or per tile; fp8: unused) and rope (fp8: 16 words; fp8_ds_mla:
    64 bf16)."""
    m2 = mask_n[:, None]
    row = slot[:, None] * ROW_WORDS
    if WORDS_2D:
        offs_c = tl.arange(0, 128)
        words = tl.load(u32_ptr + row + offs_c[None, :], mask=m2, other=0)
        if FORMAT == FMT_DS_MLA:
            scales = tl.load(f32_ptr + row + 128 + (offs_c // 32)[None, :], mask=m2, other=0.0)
    else:
        offs_t = tl.arange(0, 4)
        offs_c = tl.arange(0, 32)
        words = tl.load(u32_ptr + row[:, :, None] + offs_t[None, :, None] * 32
                        + offs_c[None, None, :], mask=mask_n[:, None, None], other=0)
        if FORMAT == FMT_DS_MLA:
            scales = tl.load(f32_ptr + row + 128 + offs_t[None, :], mask=m2, other=0.0)
    if FORMAT == FMT_DS_MLA:
        rope = _ds_rope(bf16_ptr, slot, mask_n, ROW_WORDS)
    else:
        scales = tl.zeros((BLOCK_N,), tl.float32)
        rope = tl.load(u32_ptr + row + 128 + tl.arange(0, 16)[None, :], mask=m2, other=0)
    return words, scales, rope


@triton.jit
def _fp8_lanes(words, scales, FORMAT: tl.constexpr, HW_FP8: tl.constexpr,
               SW_SCALE: tl.constexpr, WORDS_2D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Latent lanes 0..3, each fp16 [BLOCK_N, 128]; fp8_ds_mla tiles scaled to true values."""
    k0, k1, k2, k3 = e4m3x4_to_f16(words, HW_FP8)
    if FORMAT == FMT_DS_MLA:
        s = scales
        if not HW_FP8:
            s = s * SW_SCALE
        s = s.to(tl.float16)
        if not WORDS_2D:
            s = s[:, :, None]
        k0, k1, k2, k3 = k0 * s, k1 * s, k2 * s, k3 * s
    if not WORDS_2D:
        k0 = tl.reshape(k0, (BLOCK_N, 128))
        k1 = tl.reshape(k1, (BLOCK_N, 128))
        k2 = tl.reshape(k2, (BLOCK_N, 128))
        k3 = tl.reshape(k3, (BLOCK_N, 128))
    return k0, k1, k2, k3


@triton.jit
def _tma_tile(lat_desc, rope_desc, scale_desc, row0, FORMAT: tl.constexpr, HW_FP8: tl.constexpr,
              SW_SCALE: tl.constexpr, BLOCK_N: tl.constexpr):
    """A whole tile from pool row ``row0`` by tensor-memory copies: lanes 0..3 ([BLOCK_N, 128]
    fp16, fp8_ds_mla tiles scaled; bf16 as stored) and rope (fp8: [BLOCK_N, 16] words;
    otherwise [BLOCK_N, 64] bf16). Descriptor boxes: fp8 [BLOCK_N, 128] + [BLOCK_N, 16] words;
    fp8_ds_mla [BLOCK_N, 4, 32] words + [BLOCK_N, 4] scales + [BLOCK_N, 64] bf16; bf16
    [BLOCK_N, 128] + [BLOCK_N, 64]. fp8: the rope box is read before the words are converted
    (in the 16-row kernel's sm_90 SASS, triton 3.6, that removes a 64-byte spill and 42 of
    1,022 instructions per tile; H200, B=64 × 8K × 16 heads 120.6 → 114.0 µs, B=1 × 128K
    44.9 → 40.7, h200-20261201-s16-2349672-decode-variants.json; relabelling the tiles' rows so
    the words tile's reads are free of bank conflicts measured −0.7 µs at B=1, nothing at
    B=64, and 1 µs slower together with this: not kept)."""
    if FORMAT == FMT_BF16:
        return (lat_desc.load([row0, 0]), lat_desc.load([row0, 128]),
                lat_desc.load([row0, 256]), lat_desc.load([row0, 384]),
                rope_desc.load([row0, 512]))
    elif FORMAT == FMT_FP8:
        words = lat_desc.load([row0, 0])
        rope = rope_desc.load([row0, 128])
        k0, k1, k2, k3 = e4m3x4_to_f16(words, HW_FP8)
        return k0, k1, k2, k3, rope
    else:
        k0, k1, k2, k3 = _fp8_lanes(lat_desc.load([row0, 0, 0]), scale_desc.load([row0, 128]),
                                    FORMAT, HW_FP8, SW_SCALE, False, BLOCK_N)
        return k0, k1, k2, k3, rope_desc.load([row0, 264])


@triton.jit
def _load_bf16_tile(bf16_ptr, slot, mask_n):
    """BF16 rows: lanes 0..3 (dims 128 j + c), each [BLOCK_N, 128], and rope [BLOCK_N, 64]."""
    m2 = mask_n[:, None]
    base = bf16_ptr + slot[:, None] * 576 + tl.arange(0, 128)[None, :]
    rope = tl.load(bf16_ptr + slot[:, None] * 576 + 512 + tl.arange(0, 64)[None, :], mask=m2,
                   other=0.0)
    return (tl.load(base, mask=m2, other=0.0), tl.load(base + 128, mask=m2, other=0.0),
            tl.load(base + 256, mask=m2, other=0.0), tl.load(base + 384, mask=m2, other=0.0),
            rope)


@triton.jit
def _scores(q0, q1, q2, q3, qr0, qr1, qr2, qr3, k0, k1, k2, k3, rope, FORMAT: tl.constexpr,
            HW_FP8: tl.constexpr, DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):
    """q · kv over 576 dims (unscaled), [BLOCK_M, BLOCK_N] fp32."""
    qk = mma4(q0, q1, q2, q3, tl.trans(k0), tl.trans(k1), tl.trans(k2), tl.trans(k3),
              tl.zeros((BLOCK_M, BLOCK_N), tl.float32), DOT_F32)
    if FORMAT == FMT_FP8:
        r0, r1, r2, r3 = e4m3x4_to_f16(rope, HW_FP8)
        qk = mma4(qr0, qr1, qr2, qr3, tl.trans(r0), tl.trans(r1), tl.trans(r2), tl.trans(r3),
                  qk, DOT_F32)
    else:
        qk = mma(qr0, tl.trans(rope), qk, DOT_F32)
    return qk


@triton.jit
def _softmax_tile(qk, offs_n, mask_n, visible, qk_scale, m_i, m_ref, l_i, LAZY: tl.constexpr,
                  LATE_SUM: tl.constexpr):
    """One tile of the online softmax (base 2; entries past a row's causal limit or invalid are
    −inf). ``m_i`` is each row's running max (reported as max_logits), ``m_ref`` the max that P
    and the sum are taken against. Without LAZY they are equal: every tile moves ``m_ref`` and
    what came before is rescaled by α. With LAZY ``m_ref`` moves — for every row at once — only
    when some row's max has passed it by more than RESCALE_SLACK, so most tiles skip
    rescaling the accumulators (P ≤ 2^RESCALE_SLACK). ``l_i``: the sum of P per row, or
    (LATE_SUM) per (row, tile column), [BLOCK_M, BLOCK_N], summed over the columns once at the
    end — a row's columns lie in different warps, so a per-tile sum costs a shared-memory round
    trip and a barrier. Returns (running max, reference, sums, P, α, whether the accumulators need
    α: a scalar, `_rescale`)."""
    ok = (offs_n[None, :] < visible[:, None]) & mask_n[None, :]
    qk = tl.where(ok, qk * qk_scale, float("-inf"))
    m_i = tl.maximum(m_i, tl.max(qk, axis=1))
    if LAZY:
        # −inf > −inf + slack is false: rows that have seen nothing never force a move
        rescale = tl.max((m_i > m_ref + RESCALE_SLACK).to(tl.int32), axis=0) > 0
        m_new = tl.where(rescale, m_i, m_ref)
    else:
        rescale = True
        m_new = m_i
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_safe[:, None])
    alpha = tl.exp2(m_ref - m_safe)
    if LATE_SUM:
        l_i = l_i * alpha[:, None] + p
    else:
        l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_i, m_new, l_i, p, alpha, rescale


@triton.jit
def _rescale(rescale, alpha, a0, a1, a2, a3):
    """Four accumulators times α (per row) where ``rescale`` (`_softmax_tile`: a scalar when
    LAZY, else the constant True, so no branch is compiled)."""
    if rescale:
        a0, a1, a2, a3 = (a0 * alpha[:, None], a1 * alpha[:, None], a2 * alpha[:, None],
                          a3 * alpha[:, None])
    return a0, a1, a2, a3


@triton.jit
def _online_update(qk, offs_n, mask_n, visible, qk_scale, m_i, m_ref, l_i, acc0, acc1, acc2,
                   acc3, k0, k1, k2, k3, DOT_F32: tl.constexpr, LAZY: tl.constexpr,
                   LATE_SUM: tl.constexpr):
    """One tile of the online softmax and P · V into the four lane accumulators."""
    m_i, m_ref, l_i, p, alpha, rescale = _softmax_tile(qk, offs_n, mask_n, visible, qk_scale,
                                                       m_i, m_ref, l_i, LAZY, LATE_SUM)
    acc0, acc1, acc2, acc3 = _rescale(rescale, alpha, acc0, acc1, acc2, acc3)
    acc0, acc1, acc2, acc3 = _pv(p.to(k0.dtype), acc0, acc1, acc2, acc3, k0, k1, k2, k3,
                                 DOT_F32)
    return m_i, m_ref, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _pv(pm, a0, a1, a2, a3, k0, k1, k2, k3, DOT_F32: tl.constexpr):
    """Four lane accumulators advanced by one tile: a_j + P · k_j."""
    a0 = mma(pm, k0, a0, DOT_F32)
    a1 = mma(pm, k1, a1, DOT_F32)
    a2 = mma(pm, k2, a2, DOT_F32)
    a3 = mma(pm, k3, a3, DOT_F32)
    return a0, a1, a2, a3


@triton.jit
def _lanes_tile(q0, q1, q2, q3, qr0, qr1, qr2, qr3, u32_ptr, bf16_ptr, f32_ptr, lat_desc,
                rope_desc, scale_desc, n0, end, row0, slot, mask_n, visible, qk_scale, m_i, m_ref,
                l_i, acc0, acc1, acc2, acc3, TILE_TMA: tl.constexpr, FORMAT: tl.constexpr,
                HW_FP8: tl.constexpr, SW_SCALE: tl.constexpr, DOT_F32: tl.constexpr,
                ROW_WORDS: tl.constexpr, WORDS_2D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, LAZY: tl.constexpr, LATE_SUM: tl.constexpr):
    """One tile (positions n0 …) into the four lane accumulators — scores, online softmax and
    P · V: rows gathered from ``slot`` where ``mask_n`` (`_entry_slots`: entries past ``end``
    or skipped are never read), or (TILE_TMA) a whole tile from pool row ``row0`` by
    tensor-memory copies."""
    if TILE_TMA:
        k0, k1, k2, k3, rope = _tma_tile(lat_desc, rope_desc, scale_desc, row0, FORMAT, HW_FP8,
                                         SW_SCALE, BLOCK_N)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if FORMAT == FMT_BF16:
            k0, k1, k2, k3, rope = _load_bf16_tile(bf16_ptr, slot, mask_n)
        else:
            words, scales, rope = _load_fp8_tile(u32_ptr, bf16_ptr, f32_ptr, slot, mask_n,
                                                 FORMAT, ROW_WORDS, WORDS_2D, BLOCK_N)
            k0, k1, k2, k3 = _fp8_lanes(words, scales, FORMAT, HW_FP8, SW_SCALE, WORDS_2D,
                                        BLOCK_N)
    qk = _scores(q0, q1, q2, q3, qr0, qr1, qr2, qr3, k0, k1, k2, k3, rope, FORMAT, HW_FP8,
                 DOT_F32, BLOCK_M, BLOCK_N)
    if TILE_TMA:  # positions after the scores: 989 vs 1,022 sm_90 instructions per tile
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
    return _online_update(qk, offs_n, mask_n, visible, qk_scale, m_i, m_ref, l_i, acc0, acc1,
                          acc2, acc3, k0, k1, k2, k3, DOT_F32, LAZY, LATE_SUM)


@triton.jit
def _q_scale_tile(q_row, row_ok, t: tl.constexpr):
    """fp8_ds_mla's q lanes for scale tile t (dims 128 t … 128 t + 127): lane j holds dims
    4 (32 t + c) + j, fp16 [BLOCK_M, 32] each."""
    l0, l1, l2, l3 = _load_lanes(q_row + 128 * t, row_ok, True, 32)
    return l0.to(tl.float16), l1.to(tl.float16), l2.to(tl.float16), l3.to(tl.float16)


@triton.jit
def _kv_scale_tile(u32_ptr, f32_ptr, slot, mask_n, t: tl.constexpr, ROW_WORDS: tl.constexpr,
                   HW_FP8: tl.constexpr):
    """fp8_ds_mla rows' scale tile t: its four lanes unscaled, fp16 [BLOCK_N, 32] each, and
    its float32 scale [BLOCK_N] as stored (without the software conversion's factor)."""
    row = slot * ROW_WORDS
    words = tl.load(u32_ptr + row[:, None] + 32 * t + tl.arange(0, 32)[None, :],
                    mask=mask_n[:, None], other=0)
    scale = tl.load(f32_ptr + row + 128 + t, mask=mask_n, other=0.0)
    k0, k1, k2, k3 = e4m3x4_to_f16(words, HW_FP8)
    return k0, k1, k2, k3, scale


@triton.jit
def _tile_scores(qk, q0, q1, q2, q3, k0, k1, k2, k3, scale, DOT_F32: tl.constexpr):
    """qk + scale · (q · k) over one scale tile's 128 dims, the scale applied in float32."""
    part = mma4(q0, q1, q2, q3, tl.trans(k0), tl.trans(k1), tl.trans(k2), tl.trans(k3),
                tl.zeros(qk.shape, tl.float32), DOT_F32)
    return qk + part * scale[None, :]


@triton.jit
def _tile_pv(p, rescale, alpha, scale, a0, a1, a2, a3, k0, k1, k2, k3, DOT_F32: tl.constexpr):
    """One scale tile's accumulators [BLOCK_M, 32] per lane: α · acc (`_rescale`) +
    (P · scale) · k."""
    a0, a1, a2, a3 = _rescale(rescale, alpha, a0, a1, a2, a3)
    return _pv((p * scale[None, :]).to(tl.float16), a0, a1, a2, a3, k0, k1, k2, k3, DOT_F32)


@triton.jit
def _fold_tile(qa0, qa1, qa2, qa3, qb0, qb1, qb2, qb3, qc0, qc1, qc2, qc3, qd0, qd1, qd2, qd3,
               qr0, u32_ptr, bf16_ptr, f32_ptr, lat_desc, rope_desc, scale_desc, n0, end, row0,
               slot, mask_n, visible, qk_scale, m_i, m_ref, l_i,
               aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3, ac0, ac1, ac2, ac3, ad0, ad1, ad2, ad3,
               TILE_TMA: tl.constexpr, HW_FP8: tl.constexpr, SW_SCALE: tl.constexpr,
               DOT_F32: tl.constexpr, ROW_WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
               LAZY: tl.constexpr, LATE_SUM: tl.constexpr):
    """One fp8_ds_mla tile with the scales folded (q, lanes and accumulators per 128-dim scale
    tile a … d): rows gathered from ``slot`` where ``mask_n``, or (TILE_TMA) a whole tile from
    pool row ``row0`` by tensor-memory copies."""
    if TILE_TMA:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        sc4 = tl.reshape(scale_desc.load([row0, 128]), (BLOCK_N, 2, 2))  # [.., 4] scales
        sac, sbd = tl.split(sc4)  # columns 0, 2 and 1, 3
        sa, sc = tl.split(sac)
        sb, sd = tl.split(sbd)
        ka0, ka1, ka2, ka3 = e4m3x4_to_f16(lat_desc.load([row0, 0]), HW_FP8)
        kb0, kb1, kb2, kb3 = e4m3x4_to_f16(lat_desc.load([row0, 32]), HW_FP8)
        kc0, kc1, kc2, kc3 = e4m3x4_to_f16(lat_desc.load([row0, 64]), HW_FP8)
        kd0, kd1, kd2, kd3 = e4m3x4_to_f16(lat_desc.load([row0, 96]), HW_FP8)
        rope = rope_desc.load([row0, 264])
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ka0, ka1, ka2, ka3, sa = _kv_scale_tile(u32_ptr, f32_ptr, slot, mask_n, 0, ROW_WORDS,
                                                HW_FP8)
        kb0, kb1, kb2, kb3, sb = _kv_scale_tile(u32_ptr, f32_ptr, slot, mask_n, 1, ROW_WORDS,
                                                HW_FP8)
        kc0, kc1, kc2, kc3, sc = _kv_scale_tile(u32_ptr, f32_ptr, slot, mask_n, 2, ROW_WORDS,
                                                HW_FP8)
        kd0, kd1, kd2, kd3, sd = _kv_scale_tile(u32_ptr, f32_ptr, slot, mask_n, 3, ROW_WORDS,
                                                HW_FP8)
        rope = _ds_rope(bf16_ptr, slot, mask_n, ROW_WORDS)
    if HW_FP8:
        ta, tb, tc, td = sa, sb, sc, sd
    else:  # the software conversion's factor enters the scores here, the output at the end:
        # P · scale must stay within fp16 (P reaches 2^RESCALE_SLACK when LAZY); it now
        # underflows as the hardware path's does (subnormal below 2⁻¹⁴: tiles of |x| < ~0.03)
        ta, tb, tc, td = sa * SW_SCALE, sb * SW_SCALE, sc * SW_SCALE, sd * SW_SCALE
    qk = mma(qr0, tl.trans(rope), tl.zeros((qa0.shape[0], BLOCK_N), tl.float32), DOT_F32)
    qk = _tile_scores(qk, qa0, qa1, qa2, qa3, ka0, ka1, ka2, ka3, ta, DOT_F32)
    qk = _tile_scores(qk, qb0, qb1, qb2, qb3, kb0, kb1, kb2, kb3, tb, DOT_F32)
    qk = _tile_scores(qk, qc0, qc1, qc2, qc3, kc0, kc1, kc2, kc3, tc, DOT_F32)
    qk = _tile_scores(qk, qd0, qd1, qd2, qd3, kd0, kd1, kd2, kd3, td, DOT_F32)
    m_i, m_ref, l_i, p, alpha, rs = _softmax_tile(qk, offs_n, mask_n, visible, qk_scale, m_i,
                                                  m_ref, l_i, LAZY, LATE_SUM)
    aa0, aa1, aa2, aa3 = _tile_pv(p, rs, alpha, sa, aa0, aa1, aa2, aa3, ka0, ka1, ka2, ka3,
                                  DOT_F32)
    ab0, ab1, ab2, ab3 = _tile_pv(p, rs, alpha, sb, ab0, ab1, ab2, ab3, kb0, kb1, kb2, kb3,
                                  DOT_F32)
    ac0, ac1, ac2, ac3 = _tile_pv(p, rs, alpha, sc, ac0, ac1, ac2, ac3, kc0, kc1, kc2, kc3,
                                  DOT_F32)
    ad0, ad1, ad2, ad3 = _tile_pv(p, rs, alpha, sd, ad0, ad1, ad2, ad3, kd0, kd1, kd2, kd3,
                                  DOT_F32)
    return (m_i, m_ref, l_i, aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3, ac0, ac1, ac2, ac3, ad0, ad1, ad2,
            ad3)


@triton.jit
def _mla_decode_kernel(
    q_ptr, u32_ptr, bf16_ptr, f32_ptr, fp8_scale_ptr, lat_desc, rope_desc, scale_desc,
    block_table_ptr, seqlens_ptr,
    out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_bt,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_ls, stride_lh,
    softmax_scale, lse_empty, num_heads, num_splits, page_shift, num_slots, max_len,
    FORMAT: tl.constexpr, HW_FP8: tl.constexpr, DOT_F32: tl.constexpr,
    S_Q: tl.constexpr, S_Q_P2: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, ROW_WORDS: tl.constexpr,
    SW_SCALE: tl.constexpr, WORDS_2D: tl.constexpr,
    SPARSE: tl.constexpr, CAUSAL: tl.constexpr, FOLD_SCALES: tl.constexpr,
    TMA: tl.constexpr = False, CARRY: tl.constexpr = 0, LAZY: tl.constexpr = False,
    LATE_SUM: tl.constexpr = False, PDL: tl.constexpr = False,
):
    BLOCK_M: tl.constexpr = S_Q_P2 * HEADS
    FP8_LAYOUT: tl.constexpr = FORMAT != FMT_BF16
    b = tl.program_id(0)
    split = tl.program_id(1)
    hb = tl.program_id(2)

    offs_m = tl.arange(0, BLOCK_M)
    qi = offs_m // HEADS
    head = hb * HEADS + offs_m % HEADS
    row_ok = (qi < S_Q) & (head < num_heads)
    q_row = q_ptr + b.to(tl.int64) * stride_qb + qi * stride_qs + head * stride_qh

    # --- q lanes (latent) and rope -------------------------------------------------------
    if FORMAT == FMT_BF16:
        mma_t = tl.bfloat16
    else:
        mma_t = tl.float16
    q0, q1, q2, q3 = _load_lanes(q_row, row_ok, FP8_LAYOUT, 128)
    q0, q1, q2, q3 = q0.to(mma_t), q1.to(mma_t), q2.to(mma_t), q3.to(mma_t)
    if FORMAT == FMT_FP8:
        qr0, qr1, qr2, qr3 = _load_lanes(q_row + 512, row_ok, True, 16)
        qr0, qr1, qr2, qr3 = qr0.to(mma_t), qr1.to(mma_t), qr2.to(mma_t), qr3.to(mma_t)
        kv_mult = tl.load(fp8_scale_ptr) * SW_SCALE
    else:
        qr0 = tl.load(q_row[:, None] + 512 + tl.arange(0, 64)[None, :], mask=row_ok[:, None],
                      other=0.0).to(tl.bfloat16)
        qr1, qr2, qr3 = qr0, qr0, qr0  # unused: bf16 rope is one K=64 dot
        if FORMAT == FMT_BF16:
            kv_mult = tl.load(fp8_scale_ptr)  # 1, or the scale of an fp8 pool cast to bf16
        else:
            kv_mult = 1.0
    qk_scale = softmax_scale * kv_mult * LOG2E

    # --- this program's token chunk (from the device-side length) --------------------------
    # at most what the block table / index row covers (max_len): a length past it, which
    # only the validating path rejects, must not read past the row
    seqlen = tl.minimum(tl.load(seqlens_ptr + b), max_len)
    chunk = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(seqlen, start + chunk)
    if CAUSAL:
        visible = seqlen - S_Q + 1 + qi  # query i of S_Q sees the first len − S_Q + 1 + i
    else:
        visible = seqlen + qi * 0
    bt_row = block_table_ptr + b.to(tl.int64) * stride_bt

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max of the scaled scores
    m_ref = m_i  # the max P is taken against (`_softmax_tile`)
    if LATE_SUM:
        l_i = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)  # P summed per column (`_softmax_tile`)
    else:
        l_i = tl.zeros((BLOCK_M,), tl.float32)
    FOLD: tl.constexpr = (FORMAT == FMT_DS_MLA) & (BLOCK_M <= 16) & FOLD_SCALES
    if FOLD:
        # scales folded into the scores and P: q, lanes and accumulators per scale tile
        # (a, b, c, d = tiles 0..3 of 128 dims), no scaled copy of the tile. sm_90 SASS per
        # tile at 16 rows: 1,452 → 1,341 instructions; at 64 rows (wgmma) 1,030 → 2,664 with
        # 776 bytes of spills, hence only for small head blocks
        qa0, qa1, qa2, qa3 = _q_scale_tile(q_row, row_ok, 0)
        qb0, qb1, qb2, qb3 = _q_scale_tile(q_row, row_ok, 1)
        qc0, qc1, qc2, qc3 = _q_scale_tile(q_row, row_ok, 2)
        qd0, qd1, qd2, qd3 = _q_scale_tile(q_row, row_ok, 3)
        z = tl.zeros((BLOCK_M, 32), tl.float32)
        aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3 = z, z, z, z, z, z, z, z
        ac0, ac1, ac2, ac3, ad0, ad1, ad2, ad3 = z, z, z, z, z, z, z, z
        tail = start
        if TMA:  # whole tiles by tensor-memory copies, then the partial last one gathered
            tail = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
            row_next = _pool_row(bt_row, start, tail, page_shift, num_slots)
            for n0 in range(start, tail, BLOCK_N):
                row0 = row_next
                row_next = _pool_row(bt_row, n0 + BLOCK_N, tail, page_shift, num_slots)
                (m_i, m_ref, l_i, aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3, ac0, ac1, ac2, ac3, ad0,
                 ad1, ad2, ad3) = _fold_tile(
                    qa0, qa1, qa2, qa3, qb0, qb1, qb2, qb3, qc0, qc1, qc2, qc3, qd0, qd1, qd2, qd3,
                    qr0, u32_ptr, bf16_ptr, f32_ptr, lat_desc, rope_desc, scale_desc, n0, end,
                    row0, 0, None, visible, qk_scale, m_i, m_ref, l_i,
                    aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3, ac0, ac1, ac2, ac3, ad0, ad1, ad2, ad3,
                    True, HW_FP8, SW_SCALE, DOT_F32, ROW_WORDS, BLOCK_N, LAZY, LATE_SUM)
        # every tile gathered, or (TMA) the partial last one: one iteration, not pipelined
        mask_c, slot_c, raw_c = _first_slots(bt_row, tail, end, page_shift, num_slots,
                                             BLOCK_N, SPARSE, CARRY)
        for n0 in tl.range(tail, end, BLOCK_N, num_stages=1 if TMA else None):
            mask_n, slot, mask_c, slot_c, raw_c = _step_slots(
                bt_row, n0, end, page_shift, num_slots, mask_c, slot_c, raw_c, BLOCK_N, SPARSE,
                CARRY)
            (m_i, m_ref, l_i, aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3, ac0, ac1, ac2, ac3, ad0,
             ad1, ad2, ad3) = _fold_tile(
                qa0, qa1, qa2, qa3, qb0, qb1, qb2, qb3, qc0, qc1, qc2, qc3, qd0, qd1, qd2, qd3,
                qr0, u32_ptr, bf16_ptr, f32_ptr, lat_desc, rope_desc, scale_desc, n0, end, 0,
                slot, mask_n, visible, qk_scale, m_i, m_ref, l_i,
                aa0, aa1, aa2, aa3, ab0, ab1, ab2, ab3, ac0, ac1, ac2, ac3, ad0, ad1, ad2, ad3,
                False, HW_FP8, SW_SCALE, DOT_F32, ROW_WORDS, BLOCK_N, LAZY, LATE_SUM)
    else:
        acc0 = tl.zeros((BLOCK_M, 128), tl.float32)
        acc1 = tl.zeros((BLOCK_M, 128), tl.float32)
        acc2 = tl.zeros((BLOCK_M, 128), tl.float32)
        acc3 = tl.zeros((BLOCK_M, 128), tl.float32)
        tail = start
        if TMA:
            # whole tiles (each inside one page) by tensor-memory copies; the slot of tile
            # i + 1 is looked up during tile i, so the copy does not wait on the block table
            tail = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
            row_next = _pool_row(bt_row, start, tail, page_shift, num_slots)
            for n0 in range(start, tail, BLOCK_N):
                row0 = row_next
                row_next = _pool_row(bt_row, n0 + BLOCK_N, tail, page_shift, num_slots)
                m_i, m_ref, l_i, acc0, acc1, acc2, acc3 = _lanes_tile(
                    q0, q1, q2, q3, qr0, qr1, qr2, qr3, u32_ptr, bf16_ptr, f32_ptr, lat_desc,
                    rope_desc, scale_desc, n0, end, row0, 0, None, visible, qk_scale, m_i,
                    m_ref, l_i, acc0, acc1, acc2, acc3, True, FORMAT, HW_FP8, SW_SCALE, DOT_F32,
                    ROW_WORDS, WORDS_2D, BLOCK_M, BLOCK_N, LAZY, LATE_SUM)
        # every tile gathered, or (TMA) the partial last one: one iteration, not pipelined
        mask_c, slot_c, raw_c = _first_slots(bt_row, tail, end, page_shift, num_slots,
                                             BLOCK_N, SPARSE, CARRY)
        for n0 in tl.range(tail, end, BLOCK_N, num_stages=1 if TMA else None):
            mask_n, slot, mask_c, slot_c, raw_c = _step_slots(
                bt_row, n0, end, page_shift, num_slots, mask_c, slot_c, raw_c, BLOCK_N, SPARSE,
                CARRY)
            m_i, m_ref, l_i, acc0, acc1, acc2, acc3 = _lanes_tile(
                q0, q1, q2, q3, qr0, qr1, qr2, qr3, u32_ptr, bf16_ptr, f32_ptr, lat_desc,
                rope_desc, scale_desc, n0, end, 0, slot, mask_n, visible, qk_scale, m_i, m_ref,
                l_i, acc0, acc1, acc2, acc3, False, FORMAT, HW_FP8, SW_SCALE, DOT_F32, ROW_WORDS,
                WORDS_2D, BLOCK_M, BLOCK_N, LAZY, LATE_SUM)

    if PDL:  # the split combine may launch (it waits in `gdc_wait` for this grid's writes)
        gdc_launch_dependents()
    # --- normalize; write the final output (one split) or this split's partial -------------
    if LATE_SUM:
        l_i = tl.sum(l_i, axis=1)
    has = l_i != 0.0  # NaN (a NaN score) too: its lse stays NaN, not the empty row's −inf
    inv = tl.where(has, kv_mult / tl.where(has, l_i, 1.0), 0.0)
    if FOLD and not HW_FP8:  # the folded P · V ran without the software conversion's factor
        inv = inv * SW_SCALE
    lse = tl.where(has, (m_ref + tl.log2(tl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
    if DIRECT:
        o_row = out_ptr + b.to(tl.int64) * stride_ob + qi * stride_os + head * stride_oh
        l_off = b.to(tl.int64) * stride_lb + qi * stride_ls + head * stride_lh
        tl.store(lse_ptr + l_off, tl.where(has, lse, lse_empty), mask=row_ok)
        m_off = (b * S_Q + qi).to(tl.int64) * num_heads + head  # max: [batch, S_Q, heads]
        tl.store(max_ptr + m_off, m_i / LOG2E, mask=row_ok)  # max scaled score (−inf if none)
    else:
        # workspace: part_out [batch, num_splits, S_Q, num_heads, 512] fp32 (or bf16:
        # `fp8mla.decode.partials_dtype`; the stores cast), part_lse and part_max [..., heads] fp32
        rows = ((b * num_splits + split) * S_Q + qi).to(tl.int64) * num_heads + head
        tl.store(part_lse_ptr + rows, lse, mask=row_ok)
        tl.store(part_max_ptr + rows, m_i / LOG2E, mask=row_ok)
        o_row = part_out_ptr + rows * 512
    if FOLD:  # scale tile t's lanes hold dims 128 t + 4c + j
        _store_lanes(o_row, row_ok, aa0, aa1, aa2, aa3, inv, True, False)
        _store_lanes(o_row + 128, row_ok, ab0, ab1, ab2, ab3, inv, True, False)
        _store_lanes(o_row + 256, row_ok, ac0, ac1, ac2, ac3, inv, True, False)
        _store_lanes(o_row + 384, row_ok, ad0, ad1, ad2, ad3, inv, True, False)
    else:
        _store_lanes(o_row, row_ok, acc0, acc1, acc2, acc3, inv, FP8_LAYOUT)


@triton.jit
def _combine_splits_kernel(
    part_out_ptr, part_lse_ptr, part_max_ptr, out_ptr, lse_ptr, max_ptr,
    stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh,
    lse_empty, num_splits, num_heads,
    S_Q: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """LSE-weighted merge of one (request, query, head) row's split partials, BLOCK_D dims per
    program: out = Σ_s e^{lse_s − L} out_s, L = ln Σ_s e^{lse_s}. Empty splits carry lse −inf
    (and zeros: the decode kernel writes every split's partial row). One pass over the splits,
    BLOCK_S at a time, merged online (a running max rescales what came before), and a step's
    partials are loaded without waiting for its lse values, so a step costs one memory round
    trip (`fp8mla.decode.combine_blocks` picks BLOCK_D and BLOCK_S: many rows get whole-row
    programs, one long request split hundreds of ways gets narrow ones). PDL: launched as a
    programmatic dependent of the decode kernel, it starts under that grid's tail and waits
    here for its writes."""
    if PDL:
        gdc_wait()
    b = tl.program_id(0)
    qi = tl.program_id(1)
    head = tl.program_id(2) // (DIM // BLOCK_D)
    d0 = (tl.program_id(2) % (DIM // BLOCK_D)) * BLOCK_D
    row0 = (b * num_splits * S_Q + qi).to(tl.int64) * num_heads + head  # split 0's row
    row_step = S_Q * num_heads  # rows between consecutive splits
    offs_d = d0 + tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    none = tl.full((BLOCK_S,), float("-inf"), tl.float32)
    mx = tl.max(none, axis=0)  # running max of the lse values (a scalar)
    m_all = mx  # max of the splits' max logits
    total = tl.sum(tl.zeros((BLOCK_S,), tl.float32), axis=0)
    for s0 in range(0, num_splits, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        ok = offs < num_splits
        rows = row0 + offs.to(tl.int64) * row_step
        lse_s = tl.load(part_lse_ptr + rows, mask=ok, other=float("-inf"))
        parts = tl.load(part_out_ptr + rows[:, None] * DIM + offs_d[None, :], mask=ok[:, None],
                        other=0.0)
        if d0 == 0:
            m_all = tl.maximum(m_all, tl.max(tl.load(part_max_ptr + rows, mask=ok,
                                                     other=float("-inf")), axis=0))
        m_new = tl.maximum(mx, tl.max(lse_s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.exp(lse_s - m_safe)  # 0 for empty splits
        old = tl.exp(mx - m_safe)  # 0 while nothing came before
        acc = acc * old + tl.sum(parts * w[:, None], axis=0)
        total = total * old + tl.sum(w, axis=0)
        mx = m_new
    has = total != 0.0  # NaN too (a NaN partial), as in the decode kernels
    o = acc / tl.where(has, total, 1.0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + qi * stride_os + head * stride_oh + offs_d,
             o.to(tl.bfloat16))
    if d0 == 0:
        lse = tl.where(has, mx + tl.log(tl.where(has, total, 1.0)), lse_empty)
        tl.store(lse_ptr + b.to(tl.int64) * stride_lb + qi * stride_ls + head * stride_lh, lse)
        tl.store(max_ptr + (b * S_Q + qi).to(tl.int64) * num_heads + head, m_all)
