"""SM90 dense decode for programs of at most 16 query rows (s_q × heads: GLM-5 at TP8 is 8
heads, B=1 × 128K), in Gluon, with the wgmma operands swapped.

Why: wgmma's M is 64 rows. The Triton kernel's 16-row program pads q to 64 rows and reads its
fp8 tile through the register file twice (once per product, in each product's operand layout:
each value converted twice, 980 sm_90 instructions per 64-token tile). Here a tile's tokens are
M and the query rows are N:

    Sᵀ [128 tokens, 16 rows] = K [128, 576] · qᵀ          (A: the fp16 tile, K-major)
    Oᵀ [512 dims, 16 rows]  += Vᵀ [512, 128] · Pᵀ         (A: the same tile, MN-major)

so every latent value is converted once (e4m3 → fp16, exact) into one shared-memory tile that
both products read, and no MMA row is padding. Two warpgroups split q · Kᵀ by tokens (64 each)
and P · V by latent dims (256 each), so neither reads an operand the other reads; the column
softmax reduces across both. The rope enters q · Kᵀ as a register A operand converted straight
from the fp8 ring. Tiles arrive by TMA, two 64-token halves (pages of ≥ 64 tokens) into one ring
stage (222.5 KB of shared memory in all: one program per SM), whose next copy is issued as soon
as the conversion has read it. Rows past a request's end are zeroed after conversion and their
scores are −inf.

Outputs match `_mla_decode_kernel`'s: the final rows (one split) or the split's partials for
`_combine_splits_kernel`. Query row r of a program is (s_q index r // HEADS, head
hb · HEADS + r % HEADS); causal among the s_q queries.

Measured (H200, triton 3.6): correct, but slower than the Triton kernel, so the launcher leaves
it off (`fp8mla.decode.SM90_NARROW`): B=64 × 8K × 16 heads 139.3 µs against 114.5, B=1 × 128K
47.2 against 40.8 (h200-20261201-s16-1c82df8-narrow-decode-variants.json) — ~4.3 µs per tile
per SM, 2.2 per 64 tokens against the Triton kernel's 1.84. Its first form (64-token tiles, 4
warps: 160.7 µs; 8 warps splitting the rows, each warpgroup reading the whole tile: 203.5;
-542c9c4-narrow-decode-variants.json) ran one warp per scheduler with nothing to hide each
tile's chain (Nsight Compute, -f65e851-ncu-narrow-fp8-B64-H16.txt: 6% of warp slots active,
~5 cycles per issued instruction, no pipe above 15% busy, DRAM 40%).

What bounds this form (Nsight Compute, -a286446-ncu-narrow128-fp8-B64-H16.txt): 12% of warp
slots active (its 8 warps), no pipe above 19% busy, DRAM 47%; per issued instruction 2.3
cycles stalled at CTA barriers, 1.4 fixed latency, 1.1 shared-memory scoreboard, 0.9 MIO
throttle. One program's chain — conversion,
q · Kᵀ, a softmax reduced across 8 warps, P · V — runs with barriers between its steps and
P · V waited for before the next conversion (the fp16 tile has no second buffer: no room), and
nothing else on the SM fills the gaps. Per 64 tokens it moves ~229 KB through shared memory
(fp8 read 37, fp16 written 64, read 64 by each product). Fewer barriers (row sums reduced
once at the end, not per tile) might take ~10%; beating the Triton kernel needs a second
program or warpgroup per SM with work of its own, which 227 KB of shared memory does not hold
in this form.
"""

from fp8mla.kernels.decode_sm90 import AVAILABLE

if AVAILABLE:
    from fp8mla.kernels.decode_sm90 import (
        GATHER_LAYOUT,
        LOG2E,
        SHARED16,
        _cp_async,
        _cta_barrier,
        _entries,
        _row_scales,
        _split_range,
        _store_scaled,
        _tile_row,
        _tma_load,
        async_copy,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

ROWS = 16  # query rows per program: the products' N
BLOCK_N = 128  # tokens per tile: two 64-row TMA boxes, q · Kᵀ's M over both warpgroups
HALF = 64  # tokens per TMA box (pages of ≥ 64 tokens)
NUM_WARPS = 8

if AVAILABLE:
    NR = gl.constexpr(ROWS)
    BN = gl.constexpr(BLOCK_N)
    H64 = gl.constexpr(HALF)
    # Sᵀ [128, 16] and Oᵀ [512, 16]: warpgroup w holds rows 64w … 64w + 63 of every 128
    T_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                      instr_shape=[16, ROWS, 16]))
    # the rope [128, 64] as q · Kᵀ's register A operand, straight from the fp8 ring
    ROPE_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=T_LAYOUT, k_width=2))
    # a [128, 128]-byte latent chunk of the ring as the conversion reads it (8 contiguous
    # bytes per thread: `decode_sm90.RING_LAYOUT`'s lanes, conflict-free under the 128-byte
    # swizzle, with the second 64 rows in registers)
    RING = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 64], [2, 0], [64, 0]],
        lane_bases=[[0, 8], [0, 16], [0, 32], [4, 0], [1, 0]],
        warp_bases=[[8, 0], [16, 0], [32, 0]], block_bases=[], shape=[128, 128]))
    # q's [16, 128] latent blocks and [16, 64] rope (8 / 4 bf16 per thread); the output's
    # [512, 16] (4 consecutive dims per thread)
    Q_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0]))
    QR_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [8, 1], [1, 0]))
    OUT_LAYOUT = gl.constexpr(gl.BlockedLayout([4, 1], [32, 1], [4, 2], [0, 1]))

    @gluon.jit
    def _issue(lat_desc, rope_desc, lat_buf, rope_buf, bar, bt_row, n0, end, page_shift,
               pred):
        """Copy the 128-token tile at positions n0 … into the ring (when ``pred``): each
        64-token half from its own page, four [64, 128]-byte latent boxes and one [64, 64]
        rope box; one barrier for both."""
        mbarrier.expect(bar, BN * 576, pred=pred)
        for h in gl.static_range(2):
            row0 = _tile_row(bt_row, n0 + h * H64, end, page_shift)
            for c in gl.static_range(4):
                _tma_load(lat_desc, [row0, c * 128], bar,
                          lat_buf.index(c).slice(h * H64, H64, dim=0), pred=pred)
            _tma_load(rope_desc, [row0, 512], bar, rope_buf.slice(h * H64, H64, dim=0),
                      pred=pred)

    @gluon.jit
    def _convert(lat_buf, k_lat_s, rows, MASK: gl.constexpr):
        """The ring's e4m3 latent → fp16 in k_lat_s (MASK: rows from ``rows`` on as zeros —
        whatever a page holds past a request's end, or a half copied from past it)."""
        t = gl.arange(0, BN, layout=gl.SliceLayout(1, RING))
        for c in gl.static_range(4):
            x = lat_buf.index(c).load(RING).to(gl.float8e4nv, bitcast=True).to(gl.float16)
            if MASK:
                x = gl.where((t < rows)[:, None], x, 0.0)
            k_lat_s.slice(c * 128, 128, dim=1).store(x)

    @gluon.jit
    def _rows(r, hb, num_heads, S_Q: gl.constexpr, HEADS: gl.constexpr):
        """Row r's (s_q index, head) and whether it exists."""
        qi = r // HEADS
        head = hb * HEADS + r % HEADS
        return qi, head, (r < S_Q * HEADS) & (head < num_heads)

    @gluon.jit
    def _q_operand(q_ptr, b, hb, stride_qb, stride_qs, stride_qh, num_heads, col0,
                   WIDTH: gl.constexpr, LAYOUT: gl.constexpr, S_Q: gl.constexpr,
                   HEADS: gl.constexpr):
        """q's dims col0 … col0 + WIDTH − 1 of every row, fp16 [16, WIDTH] (zeros where a row
        does not exist)."""
        r = gl.arange(0, NR, layout=gl.SliceLayout(1, LAYOUT))
        qi, head, ok = _rows(r, hb, num_heads, S_Q, HEADS)
        row = q_ptr + b.to(gl.int64) * stride_qb + qi * stride_qs + head * stride_qh + col0
        c = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, LAYOUT))
        return gl.load(row[:, None] + c[None, :], mask=ok[:, None], other=0.0).to(gl.float16)

    @gluon.jit
    def _write_rows(acc, m_i, l_i, kv_mult, b, split, hb, out_ptr, lse_ptr, max_ptr,
                    part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os, stride_oh,
                    stride_lb, stride_ls, stride_lh, lse_empty, num_heads, num_splits,
                    DIRECT: gl.constexpr, S_Q: gl.constexpr, HEADS: gl.constexpr):
        """Normalize Oᵀ; write the final rows (one split: out, lse — ``lse_empty`` where nothing
        was attended — and max_logits) or this split's partials (workspace rows
        [batch, num_splits, S_Q, num_heads])."""
        has = l_i > 0.0
        lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
        inv = gl.where(has, kv_mult / gl.where(has, l_i, 1.0), 0.0)
        o = gl.convert_layout(acc * inv[None, :], OUT_LAYOUT)
        d = gl.arange(0, 512, layout=gl.SliceLayout(1, OUT_LAYOUT))
        qi, head, ok = _rows(gl.arange(0, NR, layout=gl.SliceLayout(0, OUT_LAYOUT)), hb,
                             num_heads, S_Q, HEADS)
        ri, rh, rok = _rows(gl.arange(0, NR, layout=gl.SliceLayout(0, T_LAYOUT)), hb,
                            num_heads, S_Q, HEADS)
        if DIRECT:
            o_row = out_ptr + b.to(gl.int64) * stride_ob + qi * stride_os + head * stride_oh
            gl.store(o_row[None, :] + d[:, None], o.to(gl.bfloat16), mask=ok[None, :])
            gl.store(lse_ptr + b.to(gl.int64) * stride_lb + ri * stride_ls + rh * stride_lh,
                     gl.where(has, lse, lse_empty), mask=rok)
            gl.store(max_ptr + (b * S_Q + ri).to(gl.int64) * num_heads + rh, m_i / LOG2E,
                     mask=rok)
        else:
            ws = ((b * num_splits + split) * S_Q + ri).to(gl.int64) * num_heads + rh
            gl.store(part_lse_ptr + ws, lse, mask=rok)
            gl.store(part_max_ptr + ws, m_i / LOG2E, mask=rok)
            wo = ((b * num_splits + split) * S_Q + qi).to(gl.int64) * num_heads + head
            gl.store(part_out_ptr + wo[None, :] * 512 + d[:, None], o, mask=ok[None, :])

    @gluon.jit
    def _mla_decode_narrow_kernel(
        q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, scale_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qs, stride_qh, stride_bt, stride_ob, stride_os, stride_oh,
        stride_lb, stride_ls, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, page_shift, max_len,
        DIRECT: gl.constexpr, S_Q: gl.constexpr, HEADS: gl.constexpr, CAUSAL: gl.constexpr,
    ):
        b = gl.program_id(0)
        split = gl.program_id(1)
        hb = gl.program_id(2)

        q_lat_s = gl.allocate_shared_memory(gl.float16, [NR, 512], SHARED16)
        for j in gl.static_range(4):
            q_lat_s.slice(j * 128, 128, dim=1).store(
                _q_operand(q_ptr, b, hb, stride_qb, stride_qs, stride_qh, num_heads, j * 128,
                           128, Q_LAYOUT, S_Q, HEADS))
        q_rope_s = gl.allocate_shared_memory(
            gl.float16, [NR, 64], SHARED16,
            _q_operand(q_ptr, b, hb, stride_qb, stride_qs, stride_qh, num_heads, 512, 64,
                       QR_LAYOUT, S_Q, HEADS))
        k_lat_s = gl.allocate_shared_memory(gl.float16, [BN, 512], SHARED16)
        p_s = gl.allocate_shared_memory(gl.float16, [NR, BN], SHARED16)
        lat_buf = gl.allocate_shared_memory(gl.uint8, [4, BN, 128], lat_desc.layout)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [BN, 64], rope_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        bar = bars.index(0)
        mbarrier.init(bar, count=1)
        fence_async_shared()  # q and the initialised barrier, before the async proxy

        # this program's token chunk, from the device-side length (bounded by the table's row)
        seqlen = gl.minimum(gl.load(seqlens_ptr + b), max_len)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BN)
        kv_mult = gl.load(scale_ptr)
        qk_scale = softmax_scale * kv_mult * LOG2E
        bt_row = bt_ptr + b.to(gl.int64) * stride_bt
        _issue(lat_desc, rope_desc, lat_buf, rope_buf, bar, bt_row, start, end, page_shift,
               n_tiles > 0)

        t = gl.arange(0, BN, layout=gl.SliceLayout(1, T_LAYOUT))
        qi, _, _ = _rows(gl.arange(0, NR, layout=gl.SliceLayout(0, T_LAYOUT)), hb, num_heads,
                         S_Q, HEADS)
        if CAUSAL:  # query qi sees positions up to seqlen − S_Q + qi
            last = gl.minimum(end - 1, seqlen - S_Q + qi)
        else:
            last = gl.zeros_like(qi) + (end - 1)
        m_i = gl.full([NR], float("-inf"), gl.float32, layout=gl.SliceLayout(0, T_LAYOUT))
        l_i = gl.full([NR], 0.0, gl.float32, layout=gl.SliceLayout(0, T_LAYOUT))
        acc = warpgroup_mma_init(gl.zeros([512, NR], gl.float32, layout=T_LAYOUT))
        for i in range(n_tiles):
            n0 = start + i * BN
            mbarrier.wait(bar, i & 1)
            # the last tile's P · V ran during the wait
            acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
            _cta_barrier()  # both warpgroups are done with the last tile's buffers
            # the rope straight into registers (rows past the end: whatever the page holds,
            # their scores are −inf below); the latent into the fp16 tile
            rope = rope_buf.load(ROPE_A).to(gl.float8e4nv, bitcast=True).to(gl.float16)
            if n0 + BN <= end:
                _convert(lat_buf, k_lat_s, BN, False)
            else:  # the request's partial last tile: rows past its end are zeroed, not used
                _convert(lat_buf, k_lat_s, end - n0, True)
            fence_async_shared()
            _cta_barrier()  # the ring is free: the next tile's copy lands during this one
            _issue(lat_desc, rope_desc, lat_buf, rope_buf, bar, bt_row, n0 + BN, end,
                   page_shift, i + 1 < n_tiles)
            s = gl.zeros([BN, NR], gl.float32, layout=T_LAYOUT)
            s = warpgroup_mma(k_lat_s, q_lat_s.permute((1, 0)), s)
            s = warpgroup_mma(rope, q_rope_s.permute((1, 0)), s)
            # online softmax down each column (base 2; a tile with nothing visible while
            # nothing was before leaves the state as it is)
            s = gl.where((n0 + t)[:, None] <= last[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=0))
            m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no −inf − −inf
            p = gl.exp2(s - m_ref[None, :])
            alpha = gl.exp2(m_i - m_ref)
            l_i = l_i * alpha + gl.sum(p, axis=0)
            m_i = m_new
            p_s.store(gl.permute(p.to(gl.float16), (1, 0)))
            fence_async_shared()
            _cta_barrier()
            acc = warpgroup_mma(k_lat_s.permute((1, 0)), p_s.permute((1, 0)),
                                acc * alpha[None, :], is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
        mbarrier.invalidate(bar)

        _write_rows(acc, m_i, l_i, kv_mult, b, split, hb, out_ptr, lse_ptr, max_ptr,
                    part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os, stride_oh,
                    stride_lb, stride_ls, stride_lh, lse_empty, num_heads, num_splits, DIRECT,
                    S_Q, HEADS)

    @gluon.jit
    def _gather(u8_ptr, lat_buf, slot, ok, c128):
        """cp.async of a tile's fp8_ds_mla latent bytes (slots ``slot`` where ``ok``, zeros
        elsewhere) into the ring's four [128, 128]-byte chunks; one commit group."""
        row = u8_ptr + slot.to(gl.int64)[:, None] * 656 + c128[None, :]
        for c in gl.static_range(4):
            _cp_async(lat_buf.index(c), row + c * 128, mask=ok[:, None])
        async_copy.commit_group()

    @gluon.jit
    def _rope_operand(bf16_ptr, list_row, pos, end, num_slots):
        """The bf16 rope of the entries at positions ``pos`` as q · Kᵀ's register A operand
        [128, 64] (zeros where an entry is skipped), loaded from global memory."""
        slot, ok = _entries(list_row, pos, end, num_slots)
        d = gl.arange(0, 64, layout=gl.SliceLayout(0, ROPE_A))
        return gl.load(bf16_ptr + slot.to(gl.int64)[:, None] * 328 + 264 + d[None, :],
                       mask=ok[:, None], other=0.0)

    @gluon.jit
    def _mla_sparse_narrow_kernel(
        q_ptr, u8_ptr, bf16_ptr, f32_ptr, list_ptr, count_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qh, stride_list, stride_ob, stride_oh, stride_lb, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, max_len, num_slots,
        DIRECT: gl.constexpr, HEADS: gl.constexpr,
    ):
        """Sparse decode over index lists of fp8_ds_mla rows (656 bytes: e4m3 latent, four
        float32 scales per 128 dims, bf16 rope) for ≤ 16 heads: the swapped products of
        `_mla_decode_narrow_kernel` over 128-entry tiles, each tile's latent gathered by
        cp.async (one row per list entry) into one ring stage, refilled as soon as the
        conversion (× each row's scale, in fp16) has read it. The rope and the scales of the
        next tile are loaded into registers during this one, the rope straight into q · Kᵀ's
        bf16 A operand. Entries are checked here: −1 and slots outside the pool are skipped —
        not copied (zeros), scale 0, rope 0, score −inf. Measured slower than the Triton
        kernel, so the launcher leaves it off (`fp8mla.decode.SPARSE_SM90_NARROW`): H200,
        B=64 × 8 heads × topk 2048 67.1 µs against 61.5, 16 heads 68.5 against 67.8
        (h200-20261201-s16-65e243b-narrow-sparse-variants.json) — ~7 µs per tile per SM, the
        dense form's 4.3 plus the random rows' latency the single ring stage leaves exposed."""
        b = gl.program_id(0)
        split = gl.program_id(1)
        hb = gl.program_id(2)

        q_lat_s = gl.allocate_shared_memory(gl.float16, [NR, 512], SHARED16)
        for j in gl.static_range(4):
            q_lat_s.slice(j * 128, 128, dim=1).store(
                _q_operand(q_ptr, b, hb, stride_qb, 0, stride_qh, num_heads, j * 128, 128,
                           Q_LAYOUT, 1, HEADS))
        qr = _q_operand(q_ptr, b, hb, stride_qb, 0, stride_qh, num_heads, 512, 64, QR_LAYOUT,
                        1, HEADS)
        q_rope_s = gl.allocate_shared_memory(gl.bfloat16, [NR, 64], SHARED16,
                                             qr.to(gl.bfloat16))
        k_lat_s = gl.allocate_shared_memory(gl.float16, [BN, 512], SHARED16)
        p_s = gl.allocate_shared_memory(gl.float16, [NR, BN], SHARED16)
        sh8: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                                 rank=2)
        lat_buf = gl.allocate_shared_memory(gl.uint8, [4, BN, 128], sh8)

        seqlen = gl.minimum(gl.load(count_ptr + b), max_len)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BN)
        list_row = list_ptr + b.to(gl.int64) * stride_list
        tg = gl.arange(0, BN, layout=gl.SliceLayout(1, GATHER_LAYOUT))  # the gather's rows
        cg = gl.arange(0, 128, layout=gl.SliceLayout(0, GATHER_LAYOUT))
        slot, ok = _entries(list_row, start + tg, end, num_slots)
        _gather(u8_ptr, lat_buf, slot, ok, cg)
        tr = gl.arange(0, BN, layout=gl.SliceLayout(1, RING))  # the conversion's rows
        slot_r, keep_r = _entries(list_row, start + tr, end, num_slots)
        sa, sb, sc, sd = _row_scales(f32_ptr, slot_r, keep_r)
        ta = gl.arange(0, BN, layout=gl.SliceLayout(1, ROPE_A))  # the rope operand's rows
        rope = _rope_operand(bf16_ptr, list_row, start + ta, end, num_slots)
        t = gl.arange(0, BN, layout=gl.SliceLayout(1, T_LAYOUT))  # the scores' rows
        qk_scale = softmax_scale * LOG2E

        m_i = gl.full([NR], float("-inf"), gl.float32, layout=gl.SliceLayout(0, T_LAYOUT))
        l_i = gl.full([NR], 0.0, gl.float32, layout=gl.SliceLayout(0, T_LAYOUT))
        acc = warpgroup_mma_init(gl.zeros([512, NR], gl.float32, layout=T_LAYOUT))
        for i in range(n_tiles):
            n0 = start + i * BN
            _, keep = _entries(list_row, n0 + t, end, num_slots)
            # the last tile's P · V ran during the loads above
            acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
            async_copy.wait_group(0)
            _cta_barrier()
            _store_scaled(lat_buf, k_lat_s, 0, 0, sa, RING)
            _store_scaled(lat_buf, k_lat_s, 0, 1, sb, RING)
            _store_scaled(lat_buf, k_lat_s, 0, 2, sc, RING)
            _store_scaled(lat_buf, k_lat_s, 0, 3, sd, RING)
            fence_async_shared()
            _cta_barrier()  # the ring is free: the next tile's gather lands during this one
            slot, ok = _entries(list_row, n0 + BN + tg, end, num_slots)
            _gather(u8_ptr, lat_buf, slot, ok, cg)
            s = gl.zeros([BN, NR], gl.float32, layout=T_LAYOUT)
            s = warpgroup_mma(k_lat_s, q_lat_s.permute((1, 0)), s)
            s = warpgroup_mma(rope, q_rope_s.permute((1, 0)), s)
            # the next tile's scales and rope, in flight during the rest of this one
            slot_r, keep_r = _entries(list_row, n0 + BN + tr, end, num_slots)
            sa, sb, sc, sd = _row_scales(f32_ptr, slot_r, keep_r)
            rope = _rope_operand(bf16_ptr, list_row, n0 + BN + ta, end, num_slots)
            s = gl.where(keep[:, None], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=0))
            m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no −inf − −inf
            p = gl.exp2(s - m_ref[None, :])
            alpha = gl.exp2(m_i - m_ref)
            l_i = l_i * alpha + gl.sum(p, axis=0)
            m_i = m_new
            p_s.store(gl.permute(p.to(gl.float16), (1, 0)))
            fence_async_shared()
            _cta_barrier()
            acc = warpgroup_mma(k_lat_s.permute((1, 0)), p_s.permute((1, 0)),
                                acc * alpha[None, :], is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
        async_copy.wait_group(0)

        _write_rows(acc, m_i, l_i, 1.0, b, split, hb, out_ptr, lse_ptr, max_ptr,
                    part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, 0, stride_oh,
                    stride_lb, 0, stride_lh, lse_empty, num_heads, num_splits, DIRECT, 1,
                    HEADS)
