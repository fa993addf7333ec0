"""SM90 sparse decode for programs of at most 8 query rows over fp8_ds_mla index lists, one
warp per 128-dim latent chunk ("chunk warps"), in Gluon — an experimental alternative to
`decode_sm90_mma8_sparse`, never wired into a plan. A NEGATIVE RESULT, kept in history only
(removed by the next commit): compiled offline for sm_90 (Triton 3.9, NS=3) it takes 247
registers and 64 KB of shared memory, and 818 SASS instructions per 32-token tile per warp —
against the kernel it meant to replace, 219 registers and ~889 instructions per 64-token tile.
The softmax replicated in 4 warps, the scores exchanged in two layouts and the entry/scale loads
per 32 tokens outweigh the conversions halved.

Why: `decode_sm90_mma8_sparse` gives each of its 4 warps 16 of a tile's 64 tokens in the first
product and 128 of the 512 output dims in the second, so every value is converted twice (once
in each operand layout) and qᵀ lives whole in every warp (72 registers): 219 registers, two
4-warp programs an SM, a tile chain of 3.25 µs at B=64 × 8 heads that the H200 cannot hide
(BENCHMARKS.md, sessions 26–37). Here warp c owns latent chunk c (dims 128c … 128c + 127) and
rope dims 16c … 16c + 15 for both products, over tiles of 32 tokens:

    S_c  = scale_c ⊙ (K_c · q_cᵀ) + K_rope,c · q_rope,cᵀ     (warp c; a batched mma.sync, the
                                                            chunk as the batch, one per warp)
    S    = Σ_c S_c                                          (through shared memory, 4 KB)
    Oᵀ_c += V_cᵀ · (scale_c ⊙ P)ᵀ                           (warp c, V_cᵀ from K_c's registers)

K_c's converted fp16 operand (4 byte lanes × [32 tokens, 32 words]) is transposed in registers
into V_cᵀ's by ``movmatrix`` (8 × 8 blocks; the blocks' order is a relabelling), so each value
is converted once, qᵀ is a quarter per warp, and the softmax runs in every warp on the summed
scores (8 values a thread). Lane j of word w of chunk c is dim 128c + 4w + j (as the other
kernels' lanes); the words' K order is `decode_sm90_mma8.LAT_K_BITS`' (conflict-free 8-byte
shared loads).

The ring holds NS tiles of 32 rows (16 KB latent + 4 KB rope), gathered by cp.async as in
`decode_sm90_mma8_sparse` (entries checked here: −1 and slots outside the pool are not copied,
their bytes zero, their scores −inf and scales 0).
"""

from fp8mla.kernels.decode_sm90 import AVAILABLE

BLOCK_T = 32  # tokens per tile
NUM_WARPS = 4  # one per latent chunk
SMEM_PER_SM = 227 * 1024
REGS_PER_SM = 65536


def programs_per_sm(stages: int, registers: int = 168) -> int:
    """Programs one SM holds at once: the ring (20 KB a stage) and the scores' exchange (4 KB)
    in shared memory, ``registers`` a thread (4 warps)."""
    by_smem = SMEM_PER_SM // (stages * 20 * 1024 + 4 * 1024)
    by_regs = REGS_PER_SM // (registers * 32 * NUM_WARPS)
    return max(1, min(by_smem, by_regs))


def _stored_word_bits(k):
    """For K order ``k`` (`decode_sm90_mma8.LAT_K_BITS`' first five), the stored-word bit each
    K-index bit lands on: stored(κ) = Σ_b bit_b(κ) << pos[b]."""
    return [k.index(1 << b) for b in range(5)]


if AVAILABLE:
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    from fp8mla.kernels.decode_sm90 import (
        LOG2E,
        _cp_async,
        _cta_barrier,
        _entries,
        _launch_dependents,
        _split_range,
        gl,
        gluon,
    )
    from fp8mla.kernels.decode_sm90_mma8 import LAT_K_BITS, _f16_lanes, _view

    BT = gl.constexpr(BLOCK_T)
    # the batched products: the chunk (= warp) as the batch
    MMA3 = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                                  instr_shape=[1, 16, 8]))
    KA3 = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA3, k_width=2))
    QB3 = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA3, k_width=2))
    S2 = gl.constexpr(gl.SliceLayout(0, QB3))  # [tokens, rows], the same in every warp
    # a tile's rows as the gather writes them: 16 bytes a thread, 8 lanes a row
    GATHER = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]))
    SH8 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
    XCH = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    SM2 = gl.constexpr(gl.SliceLayout(0, MMA3))  # [tokens, rows], every warp
    _K5 = LAT_K_BITS[:5]
    P0, P1, P2, P3, P4 = (gl.constexpr(b) for b in _stored_word_bits(_K5))
    # a stage's latent, [4 chunks, 32 tokens, 128 bytes] (128-byte swizzle: unit u of token t
    # at u ^ (t % 8)), as int32 [chunk, token, K index] in K order _K5: offset bits 0–4 the
    # stored word, 5–9 the token (bits 0–2 also XOR the unit), 10–11 the chunk
    K_WORDS3 = gl.constexpr(gl.SharedLinearLayout(offset_bases=(
        [[0, 0, _K5[i]] for i in range(5)]
        + [[0, 1, _K5[2]], [0, 2, _K5[3]], [0, 4, _K5[4]], [0, 8, 0], [0, 16, 0],
           [1, 0, 0], [2, 0, 0]])))
    # the rope, [32 tokens, 64 bf16] (the same swizzle over 16-byte units of 8 dims), as bf16
    # [slice c, token, dim d] for dim 16c + d: offset bits 0–2 the dim in a unit, 3–5 the
    # unit (bit 3: d's 8, bits 4–5: c), 6–10 the token (bits 0–2 also XOR the unit)
    ROPE3 = gl.constexpr(gl.SharedLinearLayout(offset_bases=(
        [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [1, 0, 0], [2, 0, 0],
         [0, 1, 8], [1, 2, 0], [2, 4, 0], [0, 8, 0], [0, 16, 0]])))
    MOVM = gl.constexpr("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;")

    @gluon.jit
    def _gather(u8_ptr, lat_buf, rope_buf, stage, slot, ok):
        """cp.async of one tile's rows (``slot`` where ``ok``; zeros elsewhere) into ring stage
        ``stage``: the latent's four 128-byte chunks chunk-major ([4 · 32, 128] bytes), the
        bf16 rope's 128 bytes; one commit group."""
        c = gl.arange(0, 128, layout=gl.SliceLayout(0, GATHER))
        row = u8_ptr + slot.to(gl.int64)[:, None] * 656 + c[None, :]
        lat = lat_buf.index(stage)
        for k in gl.static_range(4):
            _cp_async(lat.slice(k * BT, BT, dim=0), row + k * 128, mask=ok[:, None])
        _cp_async(rope_buf.index(stage), row + 528, mask=ok[:, None])
        async_copy.commit_group()

    @gluon.jit
    def _stored(k):
        """The stored word of K index ``k`` (0–31) under K order _K5."""
        return (((k & 1) << P0) | (((k >> 1) & 1) << P1) | (((k >> 2) & 1) << P2)
                | (((k >> 3) & 1) << P3) | (((k >> 4) & 1) << P4))

    @gluon.jit
    def _idx3(A: gl.constexpr, B: gl.constexpr, C: gl.constexpr, L: gl.constexpr):
        """The three index tensors of an [A, B, C] tensor in layout L, each broadcastable."""
        a = gl.arange(0, A, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
        b = gl.arange(0, B, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
        c = gl.arange(0, C, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
        return a[:, None, None], b[None, :, None], c[None, None, :]

    @gluon.jit
    def _q_operands(q_ptr, b, stride_qb, stride_qh, num_heads, HEADS: gl.constexpr):
        """qᵀ's B operands, straight from global memory: lane j's [chunk, K index, row] fp16
        (dim 128c + 4 · stored(κ) + j) and the rope's [slice, dim, row] bf16 (512 + 16c + d);
        zeros where a row does not exist."""
        c, k, r = _idx3(4, 32, 8, QB3)
        word = _stored(k)
        ok = (r < HEADS) & (r < num_heads)
        row = q_ptr + b.to(gl.int64) * stride_qb + r * stride_qh
        lat = row + 128 * c + 4 * word
        q0 = gl.load(lat, mask=ok, other=0.0).to(gl.float16)
        q1 = gl.load(lat + 1, mask=ok, other=0.0).to(gl.float16)
        q2 = gl.load(lat + 2, mask=ok, other=0.0).to(gl.float16)
        q3 = gl.load(lat + 3, mask=ok, other=0.0).to(gl.float16)
        rc, rd, rr = _idx3(4, 16, 8, QB3)
        rok = (rr < HEADS) & (rr < num_heads)
        rope = gl.load(q_ptr + b.to(gl.int64) * stride_qb + rr * stride_qh + 512 + 16 * rc + rd,
                       mask=rok, other=0.0)
        return q0, q1, q2, q3, rope

    @gluon.jit
    def _scales(f32_ptr, slot, keep, L: gl.constexpr):
        """The chunk scales of a tile's rows, float32 [4 chunks, 32 tokens] in layout L (0
        where not ``keep``; ``slot``/``keep`` [32] in SliceLayout(0, L))."""
        c = gl.arange(0, 4, layout=gl.SliceLayout(1, L))
        ptr = f32_ptr + slot.to(gl.int64)[None, :] * 164 + 128 + c[:, None]
        return gl.load(ptr, mask=keep[None, :], other=0.0)

    @gluon.jit
    def _tile_entries(list_row, pos, end, num_slots):
        """A tile's entries at ``pos`` (in the MMA3 and QB3 token layouts): (slot, attended)
        twice."""
        TM: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, MMA3))
        TQ: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, QB3))
        pm = gl.convert_layout(pos, TM)
        pq = gl.convert_layout(pos, TQ)
        sm, km = _entries(list_row, pm, end, num_slots)
        sq, kq = _entries(list_row, pq, end, num_slots)
        return sm, km, sq, kq

    @gluon.jit
    def _transpose(x):
        """V_cᵀ's A operand [chunk, word, token] from K_c's [chunk, token, word] (fp16, KA3):
        each 8 × 8 block transposed in registers (movmatrix), the blocks relabelled."""
        t = gl.inline_asm_elementwise(MOVM, "=r,r", [x], dtype=gl.float16, is_pure=False,
                                      pack=2)
        t = gl.permute(gl.reshape(t, [4, 4, 8, 4, 8]), [0, 3, 2, 1, 4])
        return gl.convert_layout(gl.reshape(t, [4, 32, 32]), KA3)

    @gluon.jit
    def _store_out(ptr, base, ok_r, o0, o1, o2, o3, inv):
        """The four lanes' Oᵀ [chunk, word, row] (dim 128c + 4 · stored(κ) + j) times ``inv``
        (per row), stored at ptr + base[r] + dim for rows where ``ok_r`` ([8] each)."""
        c, k, r = _idx3(4, 32, 8, MMA3)
        word = _stored(k)
        RL: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, MMA3))
        inv3 = gl.convert_layout(inv, RL)[None, :][None, :, :]
        base3 = gl.convert_layout(base, RL)[None, :][None, :, :]
        ok3 = gl.convert_layout(ok_r, RL)[None, :][None, :, :] & (c >= 0) & (k >= 0)
        addr = ptr + base3 + 128 * c + 4 * word
        dt: gl.constexpr = ptr.dtype.element_ty
        gl.store(addr, (o0 * inv3).to(dt), mask=ok3)
        gl.store(addr + 1, (o1 * inv3).to(dt), mask=ok3)
        gl.store(addr + 2, (o2 * inv3).to(dt), mask=ok3)
        gl.store(addr + 3, (o3 * inv3).to(dt), mask=ok3)

    @gluon.jit(do_not_specialize=["len_hint"])
    def _mla_sparse_cw_kernel(
        q_ptr, u8_ptr, f32_ptr, list_ptr, count_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qh, stride_list, stride_ob, stride_oh, stride_lb, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, max_len, num_slots, len_hint,
        DIRECT: gl.constexpr, HEADS: gl.constexpr, NS: gl.constexpr, PDL: gl.constexpr = False,
    ):
        """One (query, split) of a sparse decode over fp8_ds_mla rows (module docstring);
        outputs as `decode_sm90_mma8_sparse._mla_sparse_mma8_kernel`'s."""
        b = gl.program_id(0)
        split = gl.program_id(1)
        lat_buf = gl.allocate_shared_memory(gl.uint8, [NS, 4 * BT, 128], SH8)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [NS, BT, 128], SH8)
        # the chunks' scores (tile i's stored after the barrier every warp passes once
        # done reading tile i − 1's: one buffer)
        xch = gl.allocate_shared_memory(gl.float32, [4, BT, 8], XCH)

        list_row = list_ptr + b.to(gl.int64) * stride_list
        seqlen = gl.minimum(gl.load(count_ptr + b), max_len)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BT)
        tg = gl.arange(0, BT, layout=gl.SliceLayout(1, GATHER))
        for st in gl.static_range(NS - 1):
            slot, ok = _entries(list_row, start + st * BT + tg, end, num_slots)
            _gather(u8_ptr, lat_buf, rope_buf, st, slot, ok)
        slot_g, ok_g = _entries(list_row, start + (NS - 1) * BT + tg, end, num_slots)
        q0, q1, q2, q3, q_rope = _q_operands(q_ptr, b, stride_qb, stride_qh, num_heads, HEADS)
        qk_scale = softmax_scale * LOG2E

        TS: gl.constexpr = gl.SliceLayout(1, S2)
        TSM: gl.constexpr = gl.SliceLayout(1, SM2)
        tq = gl.arange(0, BT, layout=TS)
        sm, km, sq, kq = _tile_entries(list_row, start + tq, end, num_slots)
        sc_m = _scales(f32_ptr, sm, km, gl.SliceLayout(2, MMA3))
        sc_q = _scales(f32_ptr, sq, kq, gl.SliceLayout(2, QB3))
        keep_q = gl.convert_layout(kq, TS)
        keep_m = gl.convert_layout(km, TSM)

        # the softmax's state twice, in P's layout (S2: P, its sums, the written max) and the
        # accumulators' (SM2: the rescale factor) — the same values, computed alike in each
        m_q = gl.full([8], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S2))
        m_m = gl.full([8], float("-inf"), gl.float32, layout=gl.SliceLayout(0, SM2))
        l_acc = gl.zeros([BT, 8], gl.float32, layout=S2)
        acc0 = gl.zeros([4, 32, 8], gl.float32, layout=MMA3)
        acc1 = acc0
        acc2 = acc0
        acc3 = acc0
        for i in range(n_tiles):
            stage = i % NS
            async_copy.wait_group(NS - 2)  # this thread's copies of tile i
            _cta_barrier()  # everyone's; every warp past tile i − 1: its stage is free
            _gather(u8_ptr, lat_buf, rope_buf, (i + NS - 1) % NS, slot_g, ok_g)
            slot_g, ok_g = _entries(list_row, start + (i + NS) * BT + tg, end, num_slots)
            nm, nkm, nq, nkq = _tile_entries(list_row, start + (i + 1) * BT + tq, end,
                                             num_slots)
            sn_m = _scales(f32_ptr, nm, nkm, gl.SliceLayout(2, MMA3))
            sn_q = _scales(f32_ptr, nq, nkq, gl.SliceLayout(2, QB3))

            words = _view(lat_buf.index(stage), gl.int32, [4, BT, 32], K_WORDS3).load(KA3)
            k0, k1, k2, k3 = _f16_lanes(words)
            z = gl.zeros([4, BT, 8], gl.float32, layout=MMA3)
            s = (mma_v2(k0, q0, z) + mma_v2(k1, q1, z)) + (mma_v2(k2, q2, z)
                                                           + mma_v2(k3, q3, z))
            rope = _view(rope_buf.index(stage), gl.bfloat16, [4, BT, 16], ROPE3).load(KA3)
            s = mma_v2(rope, q_rope, s * sc_m[:, :, None])
            xch.store(s)
            _cta_barrier()  # every chunk's scores are in
            x = xch.reshape([4 * BT, 8])
            x0 = x.slice(0, BT, dim=0)
            x1 = x.slice(BT, BT, dim=0)
            x2 = x.slice(2 * BT, BT, dim=0)
            x3 = x.slice(3 * BT, BT, dim=0)
            sq2 = (x0.load(S2) + x1.load(S2)) + (x2.load(S2) + x3.load(S2))
            sm2 = (x0.load(SM2) + x1.load(SM2)) + (x2.load(SM2) + x3.load(SM2))
            sq2 = gl.where(keep_q[:, None], sq2 * qk_scale, float("-inf"))
            sm2 = gl.where(keep_m[:, None], sm2 * qk_scale, float("-inf"))
            mq_new = gl.maximum(m_q, gl.max(sq2, axis=0))
            mm_new = gl.maximum(m_m, gl.max(sm2, axis=0))
            mq_ref = gl.where(mq_new == float("-inf"), 0.0, mq_new)
            mm_ref = gl.where(mm_new == float("-inf"), 0.0, mm_new)
            p = gl.exp2(sq2 - mq_ref[None, :])
            l_acc = l_acc * gl.exp2(m_q - mq_ref)[None, :] + p
            alpha = gl.exp2(m_m - mm_ref)
            m_q = mq_new
            m_m = mm_new
            pc = (p[None, :, :] * sc_q[:, :, None]).to(gl.float16)
            if gl.min(alpha, axis=0) < 1.0:  # some row's max grew (every warp agrees)
                a3 = alpha[None, :][None, :, :]
                acc0 = acc0 * a3
                acc1 = acc1 * a3
                acc2 = acc2 * a3
                acc3 = acc3 * a3
            acc0 = mma_v2(_transpose(k0), pc, acc0)
            acc1 = mma_v2(_transpose(k1), pc, acc1)
            acc2 = mma_v2(_transpose(k2), pc, acc2)
            acc3 = mma_v2(_transpose(k3), pc, acc3)
            sc_m = sn_m
            sc_q = sn_q
            keep_q = gl.convert_layout(nkq, TS)
            keep_m = gl.convert_layout(nkm, TSM)
        async_copy.wait_group(0)
        if PDL:  # the combine may launch
            _launch_dependents()

        m_i = m_q
        l_i = gl.sum(l_acc, axis=0)
        has = l_i > 0.0
        lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
        inv = gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)
        r = gl.arange(0, 8, layout=gl.SliceLayout(0, S2))
        ok = (r < HEADS) & (r < num_heads)
        if DIRECT:
            gl.store(lse_ptr + b.to(gl.int64) * stride_lb + r * stride_lh,
                     gl.where(has, lse, lse_empty), mask=ok)
            gl.store(max_ptr + b.to(gl.int64) * num_heads + r, m_i / LOG2E, mask=ok)
            _store_out(out_ptr, b.to(gl.int64) * stride_ob + r * stride_oh, ok, acc0, acc1,
                       acc2, acc3, inv)
        else:
            ws = (b * num_splits + split).to(gl.int64) * num_heads + r
            gl.store(part_lse_ptr + ws, lse, mask=ok)
            gl.store(part_max_ptr + ws, m_i / LOG2E, mask=ok)
            _store_out(part_out_ptr, ws * 512, ok, acc0, acc1, acc2, acc3, inv)
