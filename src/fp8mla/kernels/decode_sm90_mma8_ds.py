"""SM90 dense decode of fp8_ds_mla pages for programs of at most 8 query rows (s_q × heads:
GLM-5 at TP8) — and of 9–16 (the wide form, below) — in Gluon: the sparse ≤ 8-row kernel's
tile (`decode_sm90_mma8_sparse`: per-chunk scaled score chains, one Oᵀ accumulator per 128-dim
scale chunk, P stored scaled per chunk) fed by tensor-memory copies instead of a gather, as
`decode_sm90_mma8` feeds fp8 rows.

Why: a request's positions are whole 64-token runs of one page (pages of ≥ 64 tokens), so each
tile is two TMA boxes over the 656-byte rows (`descriptors`): the latent's [4, 64, 128] bytes
(chunk-major, the ring layout the sparse kernel gathers into) and the bf16 rope's [64, 128] bytes
from byte 528. The rows' four float32 scales are loaded a tile ahead from global memory.

Per program: one (request, split) and every query row (row r: s_q index r // HEADS, head
r % HEADS; causal among the s_q queries). A ring of NS stages (40 KB each; the copy of tile
i + NS − 1 is issued once every warp is past tile i − 1, after P's barrier) and a
double-buffered P (4 KB a tile): one CTA barrier a tile. Rows past a request's end: −inf scores,
zero scales and, in the partial last tile, zeroed words in the second product (a page's tail may
hold NaN). A block-table entry outside the pool (reachable only unchecked: ``check=False``) is
never read: TMA fills its rows with zeros and its scales load as 0, so its positions score 0.
Outputs as `_mla_decode_kernel`'s: the final rows (one split) or the split's partials for
`_combine_splits_kernel`.

The wide form (``R`` = 16; `fp8mla.decode.SM90_MMA16_DS`) follows `decode_sm90_mma8`'s:
qᵀ's latent staged once in its own buffer (16 KB) and read every tile, the rope's bf16 [64, 16]
operand in registers, one P (the barrier at the top of each tile orders its reuse) and the copy
of tile i + NS − 1 issued at the top of tile i. sm_90: 255 registers, no spills on triton 3.9
(24–32 bytes on 3.6), 106 KB of shared memory (two programs per SM). H200 (triton 3.6,
h200-20261202-s22-e8f3867-wide-ds-*): B=64 × 8K × 16 heads 125.3 µs (2.76 TB/s) against the
Triton kernel's 156.8, and on programs of 1–8 tiles too (B=8 × 8K, 4 tiles: 37.1 against 46.4;
B=1 × 4K, 1 tile: 16.1 against 16.8), so it serves every length. Nsight Compute at B=64: DRAM
62% of peak (Triton: 48%), 198K cycles against 263K, 393 KB of local traffic from 3.6's spills,
stalls per issue led by fixed-latency waits (0.98) and the short scoreboard (0.51).
Its first product can be an FP8 wgmma (``QK8``: `DecodePlan(fp8_scores=True)` or
`fp8mla.decode.SM90_MMA8_DS_QK8`, off by default — scores within ~1.3e-3 of the row's largest
logit, h200-20261202-s25-qk8-precision.json; the sparse
kernel's `_scores_fp8_scaled`): per scale chunk the ring's e4m3 bytes against q's two e4m3
halves in fresh accumulators, scaled in float32, the bf16 rope by a bf16 wgmma — no spills at
255 registers, B=64 × 8K × 16 heads 116.7 against 125.5 µs (h200-20261202-s24-qk8b-flush-ab).
The 8-row form keeps mma.sync (slower with the wgmma: 110.9 against 108.9 µs at B=64 × 8 heads;
its qᵀ is in registers already).

Head blocks (`fp8mla.decode.DecodePlan._head_block`): plans of 17–32 query rows (MTP s_q 2 × 16
heads, s_q 4 × 8, 32 heads) run the wide form over ``HEADS`` = 16 // s_q heads a program, the
grid's third axis picking the block; each program addresses q, its outputs and partials from
its first head. Each block reads the request's pages again — from L2 mostly, the blocks of a
request running side by side: H200, B=64 × 8K, s_q 2 × 16 heads 195.2 against the Triton
kernel's 252.1 µs (bf16: 217.2), 32 heads 188.2 against 245.3, s_q 4 × 8 191.4 against 269.1,
B=1 × 128K × 32 heads 64.4 against 79.0 (h200-20261202-s24-965c07f-head-blocks-flush-ab.json).

Measured on the H200 (triton 3.6; h200-20261202-s20-9673ca2-mma8-ds-decode-variants.json,
ceiling 4.48 TB/s): B=1 × 128K × 8 heads 44.1 µs against the Triton kernel's 56.7 (16-row
programs), B=64 × 8K × 8 107.0 (3.23 TB/s) against 153.9, s_q 2 × 4 heads 106.9 against 153.5.
Two stages and two programs per SM (89 KB each; 240–249 registers, no spills on triton 3.6 and
3.9) beat three stages and one program at B=64 (113.3 µs); at B=1 three stages were 1 µs
faster. Nsight Compute at B=1 × 128K: DRAM 59% of peak (the Triton kernel: 40%), stalls per
issue led by the long scoreboard (1.66) and fixed-latency waits (1.05), the ALU pipe 36% busy.
"""

from fp8mla.kernels.decode_sm90 import AVAILABLE

BLOCK_N = 64  # tokens per tile: one page run (pages of ≥ 64 tokens)
ROPE_BYTE = 528  # where a 656-byte row's bf16 rope starts (after 512 e4m3 bytes, 4 scales)
NUM_WARPS = 4
SMEM_PER_SM = 227 * 1024


def programs_per_sm(stages: int, rows: int = 8) -> int:
    """Programs of ``rows`` (8, or 16: the wide form) one SM holds at once: the ring (40 KB a
    stage), P (8 KB) and, in the wide form, q's latent (16 KB; with QK8 its e4m3 halves and
    the 2 KB bf16 rope instead) in shared memory; the registers
    (240–255 a thread, 4 warps) allow two."""
    return max(1, min(2, SMEM_PER_SM // (stages * 40 * 1024 + (9 if rows == 8 else 26) * 1024)))


def descriptors(flat):
    """TMA descriptors over fp8_ds_mla rows, uint8 [num_slots, 656]: the latent as one
    [4, 64, 128]-byte box a tile (the pool seen as [4 chunks, rows, 128 bytes]) and the bf16
    rope as a [64, 128]-byte box at byte 528, both under the 128-byte swizzle."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from fp8mla.kernels.decode_sm90 import gl

    lay3 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3)
    lay2 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    lat = TensorDescriptor(flat, [4, flat.shape[0], 128], [128, flat.stride(0), 1],
                           [4, BLOCK_N, 128], lay3)
    rope = TensorDescriptor(flat, list(flat.shape), [flat.stride(0), 1], [BLOCK_N, 128], lay2)
    return lat, rope


if AVAILABLE:
    from fp8mla.kernels.decode_sm90 import (
        LOG2E,
        _cta_barrier,
        _launch_dependents,
        _tile_row,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
    )
    from fp8mla.kernels.decode_sm90_mma8 import (
        BN,
        MMA,
        NR,
        P_SHARED,
        P_SHARED_WIDE,
        Q8_LAT,
        Q_WIDE_LANES_LAT,
        Q_WIDE_STORE_LAT,
        _fresh_state,
        _head_block_ptrs,
        _issue_next,
        _last_positions,
        _q_rows,
        _ring_start,
        _view,
    )
    from fp8mla.kernels.decode_sm90_mma8_sparse import (
        SH16,
        _q8_stage_scaled,
        _q_operands,
        _q_rope_operand,
        _store_p,
        _tile_pv,
        _tile_softmax,
        _write_chunks,
    )

    ROPE_COL = gl.constexpr(ROPE_BYTE)

    @gluon.jit
    def _tile_scales(f32_ptr, bt_row, n0, end, page_shift, num_slots):
        """The four chunk scales of the tile at position ``n0``'s rows in the score layout (0
        past ``end`` and outside the pool)."""
        t = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        slot = _tile_row(bt_row, n0, end, page_shift) + t
        ok = (n0 + t < end) & (slot >= 0) & (slot < num_slots)
        srow = f32_ptr + slot.to(gl.int64) * 164 + 128  # 656-byte rows; scales at byte 512
        return (gl.load(srow, mask=ok, other=0.0), gl.load(srow + 1, mask=ok, other=0.0),
                gl.load(srow + 2, mask=ok, other=0.0), gl.load(srow + 3, mask=ok, other=0.0))

    @gluon.jit(do_not_specialize=["len_hint"])  # (a hint: no binary per value)
    def _mla_decode_mma8_ds_kernel(
        q_ptr, lat_desc, rope_desc, f32_ptr, bt_ptr, seqlens_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qs, stride_qh, stride_bt, stride_ob, stride_os, stride_oh,
        stride_lb, stride_ls, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, page_shift, max_len, num_slots,
        len_hint,
        DIRECT: gl.constexpr, S_Q: gl.constexpr, HEADS: gl.constexpr, CAUSAL: gl.constexpr,
        NS: gl.constexpr, R: gl.constexpr, QK8: gl.constexpr = False,
        PDL: gl.constexpr = False,
    ):
        gl.static_assert(R == NR or R == 16, "R: 8 or 16 query rows a program")
        gl.static_assert(NS >= 2, "NS: a ring of at least two stages")
        # QK8 at 8 rows compiled and passed its GPU tests in session 24
        # (s24-qk8a-gpu-tests.log) but measured slower; the launcher keeps mma.sync there, and
        # a path no test runs is closed
        gl.static_assert(not QK8 or R == 16, "QK8: the wide form only")
        b = gl.program_id(0)
        split = gl.program_id(1)
        # head blocks (the wide form): this program's heads from its block's first
        q_ptr, out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr = (
            _head_block_ptrs(q_ptr, out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr,
                             part_max_ptr, stride_qh, stride_oh, stride_lh, HEADS))

        lat_buf = gl.allocate_shared_memory(gl.uint8, [NS, 4, BN, 128], lat_desc.layout)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [NS, BN, 128], rope_desc.layout)
        if R == NR:
            p_s = gl.allocate_shared_memory(gl.float16, [2 * 4, BN, R], P_SHARED)  # two P
        else:  # the wide form: one P (the top barrier orders its reuse), qᵀ's latent staged
            p_s = gl.allocate_shared_memory(gl.float16, [4, BN, R], P_SHARED_WIDE)
            if not QK8:
                q_lat = gl.allocate_shared_memory(gl.float16, [R, 512], Q_WIDE_STORE_LAT)
        if QK8:  # qᵀ for the wgmma: the latent's e4m3 halves, the bf16 rope
            q8_lat = gl.allocate_shared_memory(gl.float8e4nv, [8 * R, 128], Q8_LAT)
            q_rope_s = gl.allocate_shared_memory(gl.bfloat16, [R, 64], SH16)
        # this program's token chunk; the ring's first NS − 1 tiles in flight before q is read
        bars, seqlen, start, end, n_tiles, bt_row = _ring_start(
            lat_desc, rope_desc, lat_buf, rope_buf, seqlens_ptr, bt_ptr, stride_bt, b, split,
            num_splits, page_shift, max_len, len_hint, NS, ROPE_COL)
        sc0, sc1, sc2, sc3 = _tile_scales(f32_ptr, bt_row, start, end, page_shift, num_slots)
        qk_scale = softmax_scale * LOG2E

        if QK8:
            q_inv = _q8_stage_scaled(q8_lat, q_rope_s, q_ptr, b, stride_qb, stride_qs,
                                     stride_qh, num_heads, S_Q, HEADS, R)
            fence_async_shared()  # q's halves and rope, before the wgmma reads them
            _cta_barrier()
            qs = q8_lat
            q_rope = q_rope_s
        elif R == NR:  # qᵀ (the ring's last stage is free until tile 0's barrier)
            q_inv = None
            qs, q_rope = _q_operands(lat_buf.index(NS - 1), q_ptr, b, stride_qb, stride_qs,
                                     stride_qh, num_heads, S_Q, HEADS)
        else:  # the latent's lanes read every tile from their own buffer
            q_inv = None
            q_lat.store(_q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 0, 512,
                                S_Q, HEADS, R))
            q_rope = _q_rope_operand(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, S_Q,
                                     HEADS, R)
            _cta_barrier()
            qs = _view(q_lat, gl.float16, [4 * 128, R], Q_WIDE_LANES_LAT)

        t = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        last = _last_positions(end, seqlen, num_heads, S_Q, HEADS, CAUSAL, R)
        m_i, l_acc, acc0, acc1, acc2, acc3 = _fresh_state(R)
        row_next = _tile_row(bt_row, start + (NS - 1) * BN, end, page_shift)
        for i in range(n_tiles):
            n0 = start + i * BN
            stage = i % NS
            if R > NR:  # the wide form issues the next copy before this tile's work
                fence_async_shared()
                _cta_barrier()  # every warp is past tile i − 1: its stage and P are free
                row_next = _issue_next(lat_desc, rope_desc, lat_buf, rope_buf, bars, i, n_tiles,
                                       row_next, bt_row, start, end, page_shift, NS, ROPE_COL)
            sn0, sn1, sn2, sn3 = _tile_scales(f32_ptr, bt_row, n0 + BN, end, page_shift,
                                              num_slots)
            mbarrier.wait(bars.index(stage), (i // NS) & 1)
            p, alpha, m_i, l_acc = _tile_softmax(
                lat_buf.index(stage), rope_buf.index(stage), qs, q_rope, sc0, sc1, sc2, sc3,
                (n0 + t)[:, None] <= last[None, :], qk_scale, m_i, l_acc, R > NR, q_inv, QK8)
            if R == NR:
                p_base = 4 * (i % 2)
            else:
                p_base = 0
            _store_p(p_s, p_base, p, sc0, sc1, sc2, sc3)
            if R == NR:
                # the generic proxy's reads of the stage copied into next (tile i − 1's, or
                # q's staging at i = 0) ordered before the TMA's writes; then P is whole and
                # every warp is past tile i − 1: its stage is free
                fence_async_shared()
            _cta_barrier()  # (the wide form: P is whole)
            if R == NR:
                row_next = _issue_next(lat_desc, rope_desc, lat_buf, rope_buf, bars, i, n_tiles,
                                       row_next, bt_row, start, end, page_shift, NS, ROPE_COL)
            acc0, acc1, acc2, acc3 = _tile_pv(lat_buf.index(stage), p_s, p_base, alpha, acc0,
                                              acc1, acc2, acc3, end - n0)
            sc0, sc1, sc2, sc3 = sn0, sn1, sn2, sn3
        for st in gl.static_range(NS):
            mbarrier.invalidate(bars.index(st))
        if PDL:  # the combine may launch (`_launch_dependents`)
            _launch_dependents()

        _write_chunks(acc0, acc1, acc2, acc3, m_i, l_acc, b, split, out_ptr, lse_ptr, max_ptr,
                      part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os, stride_oh,
                      stride_lb, stride_ls, stride_lh, lse_empty, num_heads, num_splits, DIRECT,
                      S_Q, HEADS)
