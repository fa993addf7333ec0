"""Lightning-indexer logits from FP8 keys (docs/DESIGN.md §2):

    logit[r, s] = Σ_j w[r, j] · ReLU(q[r, j] · k[s]) · k_scale[s]   for lo[r] <= s < hi[r],
    −inf elsewhere in [0, max_len).

Windows: contiguous keys take lo / hi per row; paged decode takes the context lengths and
derives them (query i of S_Q in a request of length L sees [0, L − S_Q + 1 + i)), or with
ROW_LENS each query row's own length L (it sees [0, L)).

One program per (query row, ``span`` key positions), span a multiple of BLOCK_S chosen by the
launcher (more positions per program when rows × positions leave programs to spare): q is loaded
and converted once per program, then the program walks the span's tiles that meet the row's
window and writes −inf over the tiles outside it. The walk is, with TMA (paged keys in pages of
≥ BLOCK_S keys, SM90+), one tensor-memory copy per tile that the compiler pipelines two tiles
deep, the next tile's page and scales fetched a tile ahead; otherwise a loop the compiler
pipelines (its next-tile copy waits behind the page-table and scale loads), or with PREFETCH
(from ``fp8mla.indexer.PREFETCH_MIN_HEADS`` heads) one that carries tile i+1's keys and scales
in registers. With one tile per program, q's conversion costs as much as the keys' (H × 128
values each). Keys are e4m3 bytes read as 32-bit words (four values each, converted to fp16
lanes as in the decode kernel, lane j = dims 4c + j) with one float32 scale per key. Key
addressing:
- PAGED (DeepGEMM's ``fp8_paged_mqa_logits`` cache): per page, page_size · 128 key bytes, then
  page_size float32 scales; row r belongs to request r // S_Q, whose block table maps positions.
- contiguous (``fp8_mqa_logits``): key bytes [S, 128] and scales [S] as separate tensors.
q is fp8 (words, same conversion; its per-token scale is folded into w) or bf16 / fp16.
KEYS_AS_ROWS: scores as [keys, heads], so the ReLU-weighted sum over heads stays within each
thread's quad; otherwise [heads, keys] and that sum crosses warps through shared memory every
tile (the instruction counts are in `fp8mla.indexer`).
"""

import triton
import triton.language as tl

from fp8mla.kernels.common import mma4
from fp8mla.kernels.fp8 import e4m3x4_to_f16


@triton.jit
def _q_lanes(q_row, offs_h, mask_h, Q_FP8: tl.constexpr, HW_FP8: tl.constexpr):
    """q of one query row as four fp16 lanes [H_P2, 32] (lane j = dims 4c + j)."""
    offs_c = tl.arange(0, 32)
    m = mask_h[:, None]
    if Q_FP8:
        words = tl.load(q_row + offs_h[:, None] * 32 + offs_c[None, :], mask=m, other=0)
        return e4m3x4_to_f16(words, HW_FP8)
    else:
        base = q_row + offs_h[:, None] * 128 + 4 * offs_c[None, :]
        return (tl.load(base, mask=m, other=0.0).to(tl.float16),
                tl.load(base + 1, mask=m, other=0.0).to(tl.float16),
                tl.load(base + 2, mask=m, other=0.0).to(tl.float16),
                tl.load(base + 3, mask=m, other=0.0).to(tl.float16))


@triton.jit
def _in_window(offs_s, lo, t_hi):
    """Which key positions lie in a row's window [lo, t_hi)."""
    return (offs_s >= lo) & (offs_s < t_hi)


@triton.jit
def _scale_words(page_words, off, page_shift):
    """Word offset of the scale of key ``off`` in the page starting at word ``page_words``
    (after the page's 2^page_shift rows of 32 key words)."""
    return page_words + (32 << page_shift) + off


@triton.jit
def _pool_page(bt_row, pos, valid, page_shift, num_pages):
    """The block-table page of key positions ``pos`` (0 where not ``valid``) and whether it
    lies in the pool: a page outside it (an entry only the validating path rejects) is never
    read, its keys' logits −inf."""
    page = tl.load(bt_row + (pos >> page_shift), mask=valid, other=0)
    ok = (page >= 0) & (page < num_pages)
    return tl.where(ok, page, 0), ok


@triton.jit
def _key_rows(bt_row, s0, lo, t_hi, page_shift, num_pages, PAGED: tl.constexpr,
              ROWS_ALIGNED: tl.constexpr, BLOCK_S: tl.constexpr):
    """Keys s0 … s0 + BLOCK_S − 1: which lie in the window [lo, t_hi) (and, paged, on a page
    of the pool), and where they live — word offsets of their rows and of their scales. Pages
    hold 2^page_shift keys (shifts and masks, not a division by a runtime page size)."""
    offs_s = s0 + tl.arange(0, BLOCK_S)
    in_win = _in_window(offs_s, lo, t_hi)
    if PAGED:
        page, ok = _pool_page(bt_row, offs_s, in_win, page_shift, num_pages)
        in_win = in_win & ok
        page = page.to(tl.int64)
        off = offs_s & ((1 << page_shift) - 1)
        page_words = (page << page_shift) * 33  # a page is page_size · 132 bytes
        row = page_words + off * 32
        if ROWS_ALIGNED:  # page_size % 4 == 0: every key row starts on 16 bytes (the shift
            row = tl.multiple_of(row, 4)  # hides it from the compiler: 4-byte copies, −30%)
        return in_win, row, _scale_words(page_words, off, page_shift)
    else:
        pos = offs_s.to(tl.int64)
        return in_win, pos * 32, pos


@triton.jit
def _key_tile(k_u32_ptr, k_f32_ptr, k_scale_ptr, row, scale_at, in_win, PAGED: tl.constexpr):
    """Keys at word offsets row (masked by in_win): words [BLOCK_S, 32] and float32 scales
    [BLOCK_S] (in the pages' tails, or a separate tensor for contiguous keys)."""
    words = tl.load(k_u32_ptr + row[:, None] + tl.arange(0, 32)[None, :],
                    mask=in_win[:, None], other=0)
    if PAGED:
        k_scale = tl.load(k_f32_ptr + scale_at, mask=in_win, other=0.0)
    else:
        k_scale = tl.load(k_scale_ptr + scale_at, mask=in_win, other=0.0)
    return words, k_scale


@triton.jit
def _page_scales(k_f32_ptr, page, s0, t_hi, page_shift, BLOCK_S: tl.constexpr):
    """float32 scales of keys s0 … s0 + BLOCK_S − 1, all in ``page`` (zeros from t_hi on)."""
    off = (s0 & ((1 << page_shift) - 1)) + tl.arange(0, BLOCK_S)
    at = _scale_words((page.to(tl.int64) << page_shift) * 33, off, page_shift)
    return tl.load(k_f32_ptr + at, mask=s0 + tl.arange(0, BLOCK_S) < t_hi, other=0.0)


@triton.jit
def _relu(s):
    """ReLU that keeps NaN (as ``torch.relu``): a NaN score — a NaN stored in a key or q —
    makes its logit NaN, which top-k never selects, on every backend. (Plain ``tl.maximum`` is
    ``max.f32`` on the GPU, which drops NaN, and drops it in the interpreter from triton 3.8
    on; ``max.NaN.f32`` is one instruction as well.)"""
    return tl.maximum(s, 0.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _tile_logits(words, k_scale, q0, q1, q2, q3, w, HW_FP8: tl.constexpr,
                 DOT_F32: tl.constexpr, KEYS_AS_ROWS: tl.constexpr, OUT_SCALE: tl.constexpr):
    """Σ_j w_j · ReLU(q_j · k) · k_scale for one tile of keys: float32 [BLOCK_S]."""
    k0, k1, k2, k3 = e4m3x4_to_f16(words, HW_FP8)
    if KEYS_AS_ROWS:  # scores [BLOCK_S, H]: the head sum stays within a quad
        s = mma4(k0, k1, k2, k3, tl.trans(q0), tl.trans(q1), tl.trans(q2), tl.trans(q3),
                 tl.zeros((words.shape[0], q0.shape[0]), tl.float32), DOT_F32)
        logit = tl.sum(_relu(s) * w[None, :], axis=1)
    else:  # scores [H, BLOCK_S]
        s = mma4(q0, q1, q2, q3, tl.trans(k0), tl.trans(k1), tl.trans(k2), tl.trans(k3),
                 tl.zeros((q0.shape[0], words.shape[0]), tl.float32), DOT_F32)
        logit = tl.sum(_relu(s) * w[:, None], axis=0)
    return logit * (k_scale * OUT_SCALE)


@triton.jit
def _indexer_logits_kernel(
    q_ptr, w_ptr, k_u32_ptr, k_f32_ptr, k_scale_ptr, keys_desc,
    block_table_ptr, lo_ptr, hi_ptr, out_ptr,
    stride_qr, stride_wr, stride_bt, stride_or,
    num_heads, max_len, page_shift, span, num_pages,
    S_Q: tl.constexpr, H_P2: tl.constexpr, BLOCK_S: tl.constexpr, PAGED: tl.constexpr,
    Q_FP8: tl.constexpr, HW_FP8: tl.constexpr, DOT_F32: tl.constexpr, OUT_SCALE: tl.constexpr,
    KEYS_AS_ROWS: tl.constexpr, ROWS_ALIGNED: tl.constexpr, PREFETCH: tl.constexpr,
    TMA: tl.constexpr = False, ROW_LENS: tl.constexpr = False,
):
    r = tl.program_id(0)
    base = tl.program_id(1) * span
    if PAGED:  # row r is query r % S_Q of request r // S_Q
        lo = 0
        if ROW_LENS:  # hi_ptr: each query row's own context length
            hi = tl.maximum(tl.load(hi_ptr + r), 0)
        else:  # hi_ptr: the requests' context lengths, the queries causal among them
            hi = tl.maximum(tl.load(hi_ptr + r // S_Q) - S_Q + 1 + r % S_Q, 0)
    else:
        lo = tl.load(lo_ptr + r)
        hi = tl.load(hi_ptr + r)
    out_row = out_ptr + r.to(tl.int64) * stride_or
    # the span's tiles that meet the window: [t_lo, t_hi); the others are −inf throughout
    t_lo = tl.maximum(base, lo - lo % BLOCK_S)
    t_hi = tl.minimum(tl.minimum(base + span, hi), max_len)  # never past the output
    for s0 in range(base, base + span, BLOCK_S):
        if (s0 < t_lo) | (s0 >= t_hi):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            tl.store(out_row + offs_s, tl.full((BLOCK_S,), float("-inf"), tl.float32),
                     mask=offs_s < max_len)

    if t_lo < t_hi:  # q only where a tile is computed (a short row in a wide output has none)
        offs_h = tl.arange(0, H_P2)
        mask_h = offs_h < num_heads
        q0, q1, q2, q3 = _q_lanes(q_ptr + r.to(tl.int64) * stride_qr, offs_h, mask_h, Q_FP8,
                                  HW_FP8)
        w = tl.load(w_ptr + r.to(tl.int64) * stride_wr + offs_h, mask=mask_h, other=0.0)
        bt_row = block_table_ptr + (r // S_Q).to(tl.int64) * stride_bt
        offs = tl.arange(0, BLOCK_S)
        if TMA:
            # paged keys, pages of ≥ BLOCK_S keys: each tile's words are one tensor-memory copy
            # ([1, BLOCK_S, 32] of [pages, page_size, 32]); tile i + 1's page and scales (plain
            # loads: not an MMA operand, so the compiler would not pipeline their copy) are
            # fetched during tile i, so the pipelined copies never wait on the block table.
            # Keys past the window are read (inside their page) and their logits replaced by
            # −inf.
            # A page outside the pool reads page 0 and writes −inf over its keys.
            page_next, ok_next = _pool_page(bt_row, t_lo, t_lo < t_hi, page_shift, num_pages)
            scale_next = _page_scales(k_f32_ptr, page_next, t_lo, t_hi, page_shift, BLOCK_S)
            for s0 in range(t_lo, t_hi, BLOCK_S):
                page, ok, k_scale = page_next, ok_next, scale_next
                page_next, ok_next = _pool_page(bt_row, s0 + BLOCK_S, s0 + BLOCK_S < t_hi,
                                                page_shift, num_pages)
                scale_next = _page_scales(k_f32_ptr, page_next, s0 + BLOCK_S, t_hi, page_shift,
                                          BLOCK_S)
                words = tl.reshape(keys_desc.load([page, s0 & ((1 << page_shift) - 1), 0]),
                                   (BLOCK_S, 32))
                logit = _tile_logits(words, k_scale, q0, q1, q2, q3, w, HW_FP8, DOT_F32,
                                     KEYS_AS_ROWS, OUT_SCALE)
                offs_s = s0 + offs
                tl.store(out_row + offs_s,
                         tl.where(_in_window(offs_s, lo, t_hi) & ok, logit, float("-inf")),
                         mask=offs_s < max_len)
        elif PREFETCH:
            # registers carry tile i+1's keys and scales and tile i+2's row offsets, loaded
            # before tile i's math (the compiler's 2-stage pipeline issues the next tile's copy
            # only after the math, behind the page-table and scale loads)
            in_win, row, scale_at = _key_rows(bt_row, t_lo, lo, t_hi, page_shift, num_pages,
                                              PAGED, ROWS_ALIGNED, BLOCK_S)
            words, k_scale = _key_tile(k_u32_ptr, k_f32_ptr, k_scale_ptr, row, scale_at,
                                       in_win, PAGED)
            in_x, row_x, scale_x = _key_rows(bt_row, t_lo + BLOCK_S, lo, t_hi, page_shift,
                                             num_pages, PAGED, ROWS_ALIGNED, BLOCK_S)
            for s0 in tl.range(t_lo, t_hi, BLOCK_S, num_stages=1):
                words_x, k_scale_x = _key_tile(k_u32_ptr, k_f32_ptr, k_scale_ptr, row_x,
                                               scale_x, in_x, PAGED)
                in_y, row_y, scale_y = _key_rows(bt_row, s0 + 2 * BLOCK_S, lo, t_hi,
                                                 page_shift, num_pages, PAGED, ROWS_ALIGNED,
                                                 BLOCK_S)
                logit = _tile_logits(words, k_scale, q0, q1, q2, q3, w, HW_FP8, DOT_F32,
                                     KEYS_AS_ROWS, OUT_SCALE)
                tl.store(out_row + s0 + offs, tl.where(in_win, logit, float("-inf")),
                         mask=s0 + offs < max_len)
                words, k_scale, in_win = words_x, k_scale_x, in_x
                row_x, scale_x, in_x = row_y, scale_y, in_y
        else:
            for s0 in range(t_lo, t_hi, BLOCK_S):
                in_win, row, scale_at = _key_rows(bt_row, s0, lo, t_hi, page_shift, num_pages,
                                                  PAGED, ROWS_ALIGNED, BLOCK_S)
                words, k_scale = _key_tile(k_u32_ptr, k_f32_ptr, k_scale_ptr, row, scale_at,
                                           in_win, PAGED)
                logit = _tile_logits(words, k_scale, q0, q1, q2, q3, w, HW_FP8, DOT_F32,
                                     KEYS_AS_ROWS, OUT_SCALE)
                tl.store(out_row + s0 + offs, tl.where(in_win, logit, float("-inf")),
                         mask=s0 + offs < max_len)
