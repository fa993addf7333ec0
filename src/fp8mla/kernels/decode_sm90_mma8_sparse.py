"""SM90 sparse decode for programs of at most 8 query rows (heads: GLM-5 at TP8) over index
lists of fp8_ds_mla rows, in Gluon: `decode_sm90_mma8`'s swapped mma.sync products (a tile's
64 entries as M, the rows as N, qᵀ in registers) with each tile's rows gathered and scaled.

Per program: one (query, split). A tile's rows (656 bytes: e4m3 latent, four float32 scales
per 128 dims, bf16 rope) are gathered by cp.async in 16-byte pieces (TMA cannot gather on
SM90) into a ring of NS stages (`fp8mla.decode.SPARSE_SM90_MMA8_STAGES`); the copy of tile
i + NS − 1 is issued once every warp is past tile i − 1. The entries are checked here: −1 and
slots outside the pool are not copied (their bytes zero), their scores −inf and their scales
0. The rows' scales are loaded a tile ahead, in the score layout, from global memory.

    Sᵀ   = Σ_c scale_c ⊙ (K_c · q_cᵀ) + K_rope · q_ropeᵀ   (c: the four 128-dim chunks, one MMA
           chain per chunk and lane scaled as it is added; the rope's bf16 straight from the ring)
    Oᵀ_c += V_cᵀ · (scale_c ⊙ P)ᵀ                          (one accumulator per chunk)

The second product takes the scales through P: an accumulator whose M mixed chunks (as
`decode_sm90_mma8`'s lanes do) would need a chunk's scale per row of one MMA, and scaling the
converted V instead costs a multiply per value. So accumulator c holds chunk c only, its row
m = 64r + 16w + 8h + g holding dim 4 · (8w + g) + 2r + h of the chunk (w: warp, g: lane group,
h and r: the thread's two register halves): the four bytes of one e4m3 word land in one thread's
four rows, and the converted lanes are joined into the MMA operand in registers (no shuffle:
the layouts coincide). P is stored once per chunk, scaled, in fp16.

Measured on the H200 (triton 3.6, topk 2048; h200-20261201-s19-e32f025-mma8-sparse-variants):
B=64 × 8 heads 48.0 µs against the Triton kernel's 60.8 (16-row programs), B=128 × 8 73.5
against 99.1, s_q 2 × 4 heads 70.0 against 97.5. Two stages and two programs per SM (85 KB
each; 220–238 registers, no spills on triton 3.6 and 3.9) beat three stages and one program
(56.0 µs at B=64). Nsight Compute of the 3-stage form: DRAM 40% of peak, stalls per issue
led by the long scoreboard (1.36: the gathers) and fixed-latency waits (1.08).

``QK8`` (`fp8mla.decode.SPARSE_SM90_MMA8_QK8`, off): the first product as FP8 wgmma per scale
chunk over the gathered bytes (`_scores_fp8_scaled`; q's latent in two e4m3 halves, as
`decode_sm90_mma8._q8_stage` splits it, the bf16 rope by a bf16 wgmma; the gather's writes
fenced for the async proxy before each tile's barrier) — 161 registers instead of 234, 846
instructions a tile instead of 911, but level on the H200 (B=64 × 8 heads 47.3 / 47.5 µs
against 47.3 / 47.9; h200-20261202-s24-qk8a-sparse-variants.json): the gathers' latency, not
the product, bounds it. The fp8_ds_mla dense wide form takes it (`decode_sm90_mma8_ds`).

Triton 3.6's shared-memory hazard analysis puts a CTA barrier between the gather's four latent
copies and between the four P stores (11 barriers a tile; triton 3.9: 5). Without them (one
copy op, four P allocations: 430bef4, session 26) the H200 measured level (B=64 × 8 heads 47.3 /
40.9 µs against 46.9 / 40.8; h200-20261203-s26-barriers-flush-ab.json), so they stay. Nsight
Compute at B=64 × 8 heads (h200-20261203-s26-7542535-ncu-source-sparse-B64-H8): DRAM at 52% of
peak; the loop's stall samples spread over fixed-latency waits (17%), the MIO queue (11%),
the gathers (10%) and shared-memory loads (8%) with two 4-warp programs per SM. Issuing the
next tile's five copy pieces one between each of the tile's score chains instead of at once
(e64b432, session 28) measured faster under do_bench and slower with a clean L2 (B=64 × 8 heads
46.4 / 41.8 µs against 47.0 / 41.2; h200-20261203-s28-e64b432-spread-flush-ab.json): not kept.
Over a pool the L2 holds the kernel takes ~37 µs at B=64 × 8 (h200-20261203-s28-4ce9e7d-
l2-pool-sparse.log): its own tile chain, not the gathers, is most of the time.
"""

from fp8mla.kernels.decode_sm90 import AVAILABLE

BLOCK_N = 64  # entries per tile
NUM_WARPS = 4
SMEM_PER_SM = 227 * 1024


def programs_per_sm(stages: int) -> int:
    """Programs one SM holds at once: the ring (40 KB a stage) and P (4 KB) in shared memory
    (with ``QK8``, q's halves and rope: 9 KB more, the same count at 2 or 3 stages);
    the registers (~200 a thread, 4 warps) allow two."""
    return max(1, min(2, SMEM_PER_SM // (stages * 40 * 1024 + 5 * 1024)))


if AVAILABLE:
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    from fp8mla.kernels.decode_sm90 import (
        LOG2E,
        _cp_async,
        _cta_barrier,
        _entries,
        _launch_dependents,
        _split_range,
        _stamp,
        fence_async_shared,
        gl,
        gluon,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from fp8mla.kernels.decode_sm90_mma8 import (
        BN,
        K_WORDS,
        KA,
        MMA,
        NR,
        P_SHARED,
        Q8_LAT,
        Q_LANES_LAT,
        Q_STORE_LAT,
        QB,
        V_WORDS,
        _f16_lanes,
        _fresh_state,
        _q8_latent,
        _q8_store_latent,
        _q_lanes,
        _q_raw,
        _q_rows,
        _rescale,
        _rows,
        _scores_chunk,
        _stamp_exit,
        _view,
        _wg8_latent,
        _write_rows,
    )

    # the ring's [64, 128]-byte pieces as the gather writes them: 16 bytes a thread, 8 lanes
    # a row (conflict-free under the 128-byte swizzle)
    GATHER = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]))
    SH8 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
    SH16 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                             rank=2))
    Q_ROPE = gl.constexpr(gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1]))
    # one chunk's words for the second product, [32 words, 16 entries]: word 8w + g of entries
    # 2t, 2t + 1, 2t + 8, 2t + 9 in warp w, lane 4g + t — conflict-free 4-byte reads
    V_CHUNK = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 8]], lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[8, 0], [16, 0]], block_bases=[], shape=[32, 16]))

    @gluon.jit
    def _gather(u8_ptr, lat_buf, rope_buf, stage, slot, ok):
        """cp.async of one tile's rows (``slot`` where ``ok``; zeros elsewhere) into ring stage
        ``stage``: the latent's four 128-byte chunks chunk-major ([4 · 64, 128] bytes), the
        bf16 rope's 128 bytes; one commit group."""
        c = gl.arange(0, 128, layout=gl.SliceLayout(0, GATHER))
        row = u8_ptr + slot.to(gl.int64)[:, None] * 656 + c[None, :]
        lat = lat_buf.index(stage)
        for k in gl.static_range(4):
            _cp_async(lat.slice(k * BN, BN, dim=0), row + k * 128, mask=ok[:, None])
        _cp_async(rope_buf.index(stage), row + 528, mask=ok[:, None])
        async_copy.commit_group()

    @gluon.jit
    def _tile_entries(list_row, f32_ptr, pos, end, num_slots):
        """The tile's entries at ``pos`` in the score layout: whether each is attended and the
        four chunk scales of its row (0 where not)."""
        slot, keep = _entries(list_row, pos, end, num_slots)
        srow = f32_ptr + slot.to(gl.int64) * 164 + 128
        return (keep, gl.load(srow, mask=keep, other=0.0), gl.load(srow + 1, mask=keep, other=0.0),
                gl.load(srow + 2, mask=keep, other=0.0), gl.load(srow + 3, mask=keep, other=0.0))

    @gluon.jit
    def _chunk_operand(words):
        """One chunk's words (int32 [32, 16] in V_CHUNK) as the second product's A operand,
        fp16 [128, 16]: row 64r + 16w + 8h + g holds byte 2r + h of word 8w + g."""
        x0, x1, x2, x3 = _f16_lanes(words)
        a = gl.join(gl.join(x0, x1), gl.join(x2, x3))  # [word, entry, h, r]
        a = gl.reshape(a, [4, 8, 16, 2, 2])  # [w, g, entry, h, r]
        a = gl.reshape(gl.permute(a, [4, 0, 3, 1, 2]), [128, 16])
        return gl.convert_layout(a, KA)

    @gluon.jit
    def _pv(vw, p_s, base, c: gl.constexpr, kc: gl.constexpr, acc, n_valid):
        """acc (chunk c's Oᵀ) += entries 16kc … 16kc + 15 of chunk c's Vᵀ · (scale_c ⊙ P)ᵀ
        (P: ``p_s.index(base + c)``); the words of entries from ``n_valid`` on zeroed (a
        page's tail may hold NaN)."""
        words = vw.slice(32 * c, 32, dim=0).slice(16 * kc, 16, dim=1).load(V_CHUNK)
        if n_valid < BN:
            e = gl.arange(0, 16, layout=gl.SliceLayout(0, V_CHUNK))
            words = gl.where((16 * kc + e)[None, :] < n_valid, words, 0)
        pk = p_s.index(base + c).slice(16 * kc, 16, dim=0).load(QB)
        return mma_v2(_chunk_operand(words), pk, acc)

    @gluon.jit
    def _scaled_scores(kw, qs, sc, c: gl.constexpr, s, WIDE: gl.constexpr):
        """s += the tile's chunk-c scores K_c · q_cᵀ (four lane chains), times its scales; qᵀ
        from registers (``qs``: `_q_operands`' four chunks) or, ``WIDE``, read from the staged
        lanes view ``qs`` (`decode_sm90_mma8`'s wide form)."""
        z = gl.zeros_like(s)
        if WIDE:
            qt = _q_lanes(qs, 0, 32 * c, 32, 128)
        else:
            qt = qs[c]
        t0, t1, t2, t3 = _scores_chunk(kw.slice(32 * c, 32, dim=1).load(KA), qt, z, z, z, z)
        return s + ((t0 + t1) + (t2 + t3)) * sc[:, None]

    @gluon.jit
    def _q_operands(free, q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads,
                    S_Q: gl.constexpr, HEADS: gl.constexpr):
        """qᵀ's B operands: the latent's lanes per 32-word chunk, staged through the free ring
        stage ``free`` (as `decode_sm90_mma8`), and the rope's (`_q_rope_operand`). The caller
        must pass a CTA barrier (and, before a TMA copy, a proxy fence) before anything is
        copied into ``free``: the lanes' loads end this function."""
        _view(free, gl.float16, [4 * NR, 512], Q_STORE_LAT).slice(0, NR, dim=0).store(
            _q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 0, 512, S_Q, HEADS,
                    NR))
        q_rope = _q_rope_operand(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, S_Q,
                                 HEADS, NR)
        _cta_barrier()
        lanes = _view(free, gl.float16, [4 * 4 * 128, NR], Q_LANES_LAT)
        qs = (_q_lanes(lanes, 0, 0, 32, 128), _q_lanes(lanes, 0, 32, 32, 128),
              _q_lanes(lanes, 0, 64, 32, 128), _q_lanes(lanes, 0, 96, 32, 128))
        return qs, q_rope

    @gluon.jit
    def _q_rope_operand(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads,
                        S_Q: gl.constexpr, HEADS: gl.constexpr, R: gl.constexpr):
        """qᵀ's rope, the bf16 [64, R] B operand of the rope product, straight from global
        memory (zeros where a row does not exist)."""
        k = gl.arange(0, 64, layout=gl.SliceLayout(1, Q_ROPE))
        qi, head, ok = _rows(gl.arange(0, R, layout=gl.SliceLayout(0, Q_ROPE)), num_heads,
                             S_Q, HEADS)
        row = b.to(gl.int64) * stride_qb + qi * stride_qs + head * stride_qh + 512
        q_rope = gl.load(q_ptr + row[None, :] + k[:, None], mask=ok[None, :], other=0.0)
        return gl.convert_layout(q_rope, QB)

    @gluon.jit
    def _q8_stage_scaled(q8_lat, q_rope_s, q_ptr, b, stride_qb, stride_qs, stride_qh,
                         num_heads, S_Q: gl.constexpr, HEADS: gl.constexpr, R: gl.constexpr):
        """qᵀ for `_scores_fp8_scaled`: the latent as e4m3 halves (`_q8_store_latent`, a power
        of two per row from the latent's max), the rope as it is, bf16 [R, 64] in
        ``q_rope_s`` → 2^−e per row, fp32 [R] in the scores' column layout."""
        x0, x1, x2, x3, m = _q8_latent(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads,
                                       S_Q, HEADS, R)
        e = _q8_store_latent(q8_lat, x0, x1, x2, x3, m, R)
        q_rope_s.store(_q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 512, 64,
                              S_Q, HEADS, R))
        return gl.convert_layout(gl.exp2(-e), gl.SliceLayout(0, MMA))

    @gluon.jit
    def _scores_fp8_scaled(lat, rope, q8_lat, q_rope_s, q_inv, sc0, sc1, sc2, sc3,
                           R: gl.constexpr):
        """A tile's Sᵀ [64 entries, R rows] of fp8_ds_mla rows by wgmma: per 128-dim chunk c
        the stage's e4m3 bytes against q's two halves (FP8, fresh accumulators: each chain
        128 dims long), scaled by the rows' chunk scales ``sc_c`` in float32; the bf16 rope
        against q's (``q_rope_s``); q's power of two undone by ``q_inv``."""
        WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, R, 32])
        WR: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, R, 16])
        k8 = _view(lat, gl.float8e4nv, [4 * BN, 128], Q8_LAT)
        z = warpgroup_mma_init(gl.zeros([BN, R], gl.float32, layout=WG))
        h0, l0, h1, l1, h2, l2, h3, l3 = _wg8_latent(k8, q8_lat, R, z)
        sr = warpgroup_mma(_view(rope, gl.bfloat16, [BN, 64], SH16), q_rope_s.permute((1, 0)),
                           warpgroup_mma_init(gl.zeros([BN, R], gl.float32, layout=WR)),
                           use_acc=False, is_async=True)
        h0, l0, h1, l1, h2, l2, h3, l3, sr = warpgroup_mma_wait(
            0, deps=[h0, l0, h1, l1, h2, l2, h3, l3, sr])
        s = (gl.convert_layout(h0 + l0 * 0.0625, MMA) * sc0[:, None]
             + gl.convert_layout(h1 + l1 * 0.0625, MMA) * sc1[:, None]
             + gl.convert_layout(h2 + l2 * 0.0625, MMA) * sc2[:, None]
             + gl.convert_layout(h3 + l3 * 0.0625, MMA) * sc3[:, None])
        return s * q_inv[None, :] + gl.convert_layout(sr, MMA)

    @gluon.jit
    def _tile_softmax(lat, rope, qs, q_rope, sc0, sc1, sc2, sc3, visible, qk_scale, m_i,
                      l_acc, WIDE: gl.constexpr, q_inv=None, QK8: gl.constexpr = False):
        """One tile's scores Sᵀ [64 entries, R rows] from a ring stage (``lat``, ``rope``; qᵀ
        as `_scaled_scores` takes it, ``WIDE`` or not; q_rope: bf16 [64, R]; or, ``QK8``, q's
        staged halves and rope and ``q_inv`` as `_scores_fp8_scaled` takes them),
        −inf where not ``visible``, and the online softmax down each column (base 2; a tile
        with nothing visible while nothing was before leaves the state as it is): (P, the
        accumulators' factor, the new max, P's per-thread sums)."""
        if QK8:
            s = _scores_fp8_scaled(lat, rope, qs, q_rope, q_inv, sc0, sc1, sc2, sc3,
                                   q_rope.shape[0])
        else:
            kw = _view(lat, gl.int32, [BN, 128], K_WORDS)
            s = gl.zeros([BN, q_rope.shape[1]], gl.float32, layout=MMA)
            s = _scaled_scores(kw, qs, sc0, 0, s, WIDE)
            s = _scaled_scores(kw, qs, sc1, 1, s, WIDE)
            s = _scaled_scores(kw, qs, sc2, 2, s, WIDE)
            s = _scaled_scores(kw, qs, sc3, 3, s, WIDE)
            s = mma_v2(_view(rope, gl.bfloat16, [BN, 64], SH16).load(KA), q_rope, s)
        s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no −inf − −inf
        p = gl.exp2(s - m_ref[None, :])
        alpha = gl.exp2(m_i - m_ref)[None, :]
        return p, alpha, m_new, l_acc * alpha + p

    @gluon.jit
    def _store_p(p_s, base, p, sc0, sc1, sc2, sc3):
        """P scaled per chunk, in fp16, into ``p_s.index(base + c)`` (``p_s``: [4 chunks per
        buffer, 64 entries, R rows])."""
        p_s.index(base).store((p * sc0[:, None]).to(gl.float16))
        p_s.index(base + 1).store((p * sc1[:, None]).to(gl.float16))
        p_s.index(base + 2).store((p * sc2[:, None]).to(gl.float16))
        p_s.index(base + 3).store((p * sc3[:, None]).to(gl.float16))

    @gluon.jit
    def _tile_pv(lat, p_s, base, alpha, acc0, acc1, acc2, acc3, n_valid):
        """The accumulators times ``alpha`` plus the tile's Vᵀ · (scale ⊙ P)ᵀ per chunk (P as
        `_store_p` left it at ``base``; the words of entries from ``n_valid`` on zeroed)."""
        acc0, acc1, acc2, acc3 = _rescale(alpha, acc0, acc1, acc2, acc3)
        vw = _view(lat, gl.int32, [128, BN], V_WORDS)
        for kc in gl.static_range(4):
            acc0 = _pv(vw, p_s, base, 0, kc, acc0, n_valid)
            acc1 = _pv(vw, p_s, base, 1, kc, acc1, n_valid)
            acc2 = _pv(vw, p_s, base, 2, kc, acc2, n_valid)
            acc3 = _pv(vw, p_s, base, 3, kc, acc3, n_valid)
        return acc0, acc1, acc2, acc3

    @gluon.jit
    def _write_chunks(acc0, acc1, acc2, acc3, m_i, l_acc, b, split, out_ptr, lse_ptr,
                      max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os,
                      stride_oh, stride_lb, stride_ls, stride_lh, lse_empty, num_heads,
                      num_splits, DIRECT: gl.constexpr, S_Q: gl.constexpr,
                      HEADS: gl.constexpr):
        """`_write_rows` of the per-chunk accumulators (acc c's row m: dim 128c + d(m), d(m) =
        4 · (8 · ((m >> 4) & 3) + (m & 7)) + 2 · (m >> 6) + ((m >> 3) & 1))."""
        _write_rows(acc0, acc1, acc2, acc3, 128, m_i, gl.sum(l_acc, axis=0), 1.0, b, split,
                    out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh,
                    lse_empty, num_heads, num_splits, DIRECT, S_Q, HEADS)

    @gluon.jit(do_not_specialize=["len_hint"])  # (a hint: no binary per value)
    def _mla_sparse_mma8_kernel(
        q_ptr, u8_ptr, f32_ptr, list_ptr, count_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qh, stride_list, stride_ob, stride_oh, stride_lb, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, max_len, num_slots, len_hint,
        DIRECT: gl.constexpr, HEADS: gl.constexpr, NS: gl.constexpr, QK8: gl.constexpr = False,
        PDL: gl.constexpr = False, stamp_ptr=None, TIMELINE: gl.constexpr = False,
    ):
        """One (query, split) of a sparse decode over fp8_ds_mla rows (module docstring).
        TIMELINE: the debug timeline of `decode_sm90_mma8` (entry, loop start, tile 0 landed,
        loop end, exit; the SM) into int64 ``stamp_ptr`` [programs, 12]."""
        b = gl.program_id(0)
        split = gl.program_id(1)
        if TIMELINE:
            stamp_ptr += (b * num_splits + split).to(gl.int64) * 12
            _stamp(stamp_ptr, 0)

        lat_buf = gl.allocate_shared_memory(gl.uint8, [NS, 4 * BN, 128], SH8)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [NS, BN, 128], SH8)
        p_s = gl.allocate_shared_memory(gl.float16, [4, BN, NR], P_SHARED)
        if QK8:  # qᵀ for the wgmma: the latent's e4m3 halves, the bf16 rope
            q8_lat = gl.allocate_shared_memory(gl.float8e4nv, [8 * NR, 128], Q8_LAT)
            q_rope_s = gl.allocate_shared_memory(gl.bfloat16, [NR, 64], SH16)

        # this program's entries; the ring's first STAGES − 1 tiles in flight before q is read.
        # Tile 0's entries and their rows' scales are read while the list's count loads, at the
        # chunk a count of ``len_hint`` (the plan's list width) starts at — where the count
        # gives the same start, the first gather waits on one dependent load fewer (as
        # `decode_sm90_mma8._ring_start`); masked by the count after, or read again
        list_row = list_ptr + b.to(gl.int64) * stride_list
        seqlen = gl.minimum(gl.load(count_ptr + b), max_len)
        guess, _, _ = _split_range(gl.minimum(len_hint, max_len), split, num_splits, BN)
        tg = gl.arange(0, BN, layout=gl.SliceLayout(1, GATHER))
        tm = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        slot, _ = _entries(list_row, guess + tg, max_len, num_slots)  # (inside the list's row)
        keep, sc0, sc1, sc2, sc3 = _tile_entries(list_row, f32_ptr, guess + tm, max_len,
                                                 num_slots)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BN)
        if start != guess:
            slot, _ = _entries(list_row, start + tg, end, num_slots)
            keep, sc0, sc1, sc2, sc3 = _tile_entries(list_row, f32_ptr, start + tm, end,
                                                     num_slots)
        _gather(u8_ptr, lat_buf, rope_buf, 0, slot,
                (start + tg < end) & (slot >= 0) & (slot < num_slots))
        keep = keep & (start + tm < end)  # (entries past the count: no scale, not a NaN's)
        sc0 = gl.where(keep, sc0, 0.0)
        sc1 = gl.where(keep, sc1, 0.0)
        sc2 = gl.where(keep, sc2, 0.0)
        sc3 = gl.where(keep, sc3, 0.0)
        for st in gl.static_range(1, NS - 1):
            slot, ok = _entries(list_row, start + st * BN + tg, end, num_slots)
            _gather(u8_ptr, lat_buf, rope_buf, st, slot, ok)
        slot_g, ok_g = _entries(list_row, start + (NS - 1) * BN + tg, end, num_slots)
        qk_scale = softmax_scale * LOG2E

        if QK8:
            q_inv = _q8_stage_scaled(q8_lat, q_rope_s, q_ptr, b, stride_qb, 0, stride_qh,
                                     num_heads, 1, HEADS, NR)
            fence_async_shared()  # q's halves and rope, before the wgmma reads them
            _cta_barrier()
            qs = q8_lat
            q_rope = q_rope_s
        else:  # qᵀ (the ring's last stage is free until tile 0's barrier)
            qs, q_rope = _q_operands(lat_buf.index(NS - 1), q_ptr, b, stride_qb, 0, stride_qh,
                                     num_heads, 1, HEADS)
            q_inv = None

        m_i, l_acc, acc0, acc1, acc2, acc3 = _fresh_state(NR)
        if TIMELINE:
            _stamp(stamp_ptr, 1)
        for i in range(n_tiles):
            stage = i % NS
            async_copy.wait_group(NS - 2)  # this thread's copies of tile i
            if QK8:
                fence_async_shared()  # ... before the wgmma (the async proxy) reads them
            _cta_barrier()  # everyone's; every warp past tile i − 1: its stage is free
            if TIMELINE:
                if i == 0:
                    _stamp(stamp_ptr, 2)
            _gather(u8_ptr, lat_buf, rope_buf, (i + NS - 1) % NS, slot_g, ok_g)
            slot_g, ok_g = _entries(list_row, start + (i + NS) * BN + tg, end, num_slots)
            keep_n, sn0, sn1, sn2, sn3 = _tile_entries(list_row, f32_ptr,
                                                       start + (i + 1) * BN + tm, end, num_slots)

            p, alpha, m_i, l_acc = _tile_softmax(lat_buf.index(stage), rope_buf.index(stage),
                                                 qs, q_rope, sc0, sc1, sc2, sc3, keep[:, None],
                                                 qk_scale, m_i, l_acc, False, q_inv, QK8)
            _store_p(p_s, 0, p, sc0, sc1, sc2, sc3)
            _cta_barrier()  # P is whole (and read before the next tile's barrier)
            acc0, acc1, acc2, acc3 = _tile_pv(lat_buf.index(stage), p_s, 0, alpha, acc0, acc1,
                                              acc2, acc3, BN)  # skipped entries: zeros
            keep, sc0, sc1, sc2, sc3 = keep_n, sn0, sn1, sn2, sn3
        async_copy.wait_group(0)
        if PDL:  # the combine may launch (`_launch_dependents`)
            _launch_dependents()
        if TIMELINE:
            _stamp(stamp_ptr, 3)

        _write_chunks(acc0, acc1, acc2, acc3, m_i, l_acc, b, split, out_ptr, lse_ptr, max_ptr,
                      part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, 0, stride_oh,
                      stride_lb, 0, stride_lh, lse_empty, num_heads, num_splits, DIRECT, 1,
                      HEADS)
        if TIMELINE:
            _stamp_exit(stamp_ptr)
