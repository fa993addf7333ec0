"""SM90 decode for 64-row programs, written in Gluon (explicit layouts): dense over fp8 rows
in pages of whole tiles, by TMA (`_mla_decode_sm90_kernel`), and gathered row by row
(`_mla_sparse_sm90_kernel`) over index lists of fp8_ds_mla or fp8 rows, or, its ``PAGED``
form, through the block table (dense fp8_ds_mla rows, fp8 rows in pages shorter than a tile).

Why a second kernel: Triton places the warps of a dot whose result feeds another dot all along
M, so `_mla_decode_kernel`'s 64-row program (8 warps, two warpgroups) computes the 64 × 64
score tile q · Kᵀ in both warpgroups — 72 of its 88 wgmma per tile (BENCHMARKS.md, session 13).
Here the layouts are the kernel's: S is split by token columns over the two warpgroups
([4, 2] warps, 32 columns each), O by latent dims ([4, 2], 256 each), and q, the fp16 tile and
P are shared-memory operands. H200, fp8 B=64 × 8K × 128 heads: 393 µs (372 TFLOPS) against
539; sparse fp8_ds_mla B=128 × 128 heads × topk 2048: 242 against 340 µs
(h200-20261201-s15-bb2dfd3-dense-ab.json, -a6cb0db-sparse-sm90-ab.json).

Per program: one (request, split, 64-head block, query) — or, ``PACK``, one (request, split)
holding every query's heads (s_q · heads ≤ 64 rows, each masked to its own query's prefix:
`_row_ids`, `_row_keep`); whole 64-token tiles of pages of ≥ 64 tokens arrive by TMA (four
[64, 128]-byte latent boxes and one [64, 64] rope box) in a two-stage mbarrier ring, the next
tile's copy issued before this one's math; each tile is converted once (e4m3 → fp16, exact)
into shared memory for both products. Each tile's P · V is left running
while the next tile's copy is issued and waited for (its wait before that tile's conversion
overwrites the fp16 tile): 456 → 415 µs above. (A likely reason, not profiled: the copy issue's
block-table load used to hold its warp behind the others after the product, and each tile's
barrier waited for it.) Rows past the request's end in its last tile are zeroed after conversion
(their scores are −inf), so nothing past a length is attended. Outputs match
`_mla_decode_kernel`'s: the final row (one split) or the split's partial for
`_combine_splits_kernel`.

Gluon does not run in Triton's interpreter and its API moved between triton 3.6 and 3.9 (the
aliases below); where it is missing, `AVAILABLE` is False and the launcher keeps the Triton
kernel.
"""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # names that moved between the versions this runs on (seen: 3.6 on the H200, 3.9 on CI):
    # the TMA and cp.async loads are async_load in 3.9, async_copy_global_to_shared in 3.6; a
    # CTA barrier is gl.barrier in 3.9, gl.thread_barrier in 3.6; reinterpreting shared memory
    # is .reinterpret in 3.9, ._reinterpret in 3.6
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    _NEW_REINTERPRET = hasattr(gl.shared_memory_descriptor, "reinterpret")
    AVAILABLE = True
except Exception:  # noqa: BLE001 — a Triton without (this) Gluon: the Triton kernel serves
    AVAILABLE = False

BLOCK_N = 64  # tokens per tile
HEADS = 64  # rows per program
NUM_WARPS = 8


def descriptors(flat):
    """TMA descriptors over fp8-format rows, uint8 [num_slots, 576]: (latent [64, 128]-byte
    boxes, rope [64, 64]-byte box)."""
    lay128 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    lay64 = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    return (TensorDescriptor.from_tensor(flat, [BLOCK_N, 128], lay128),
            TensorDescriptor.from_tensor(flat, [BLOCK_N, 64], lay64))


if AVAILABLE:
    LOG2E = gl.constexpr(1.4426950408889634)
    # S [64 rows, 64 tokens]: each warpgroup its 32 token columns; O [64, 512]: each its 256
    # dims; rows of 128 bytes, 16 per thread (tile copies, q); fp16/bf16
    # shared-memory operands
    S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, 32, 16]))
    O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, 256, 16]))
    ROWS_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0]))
    # the sparse gather's cp.async into the fp8 ring: 16 bytes per thread, 8 lanes across one
    # 128-byte row, so its shared-memory writes are conflict-free under the swizzle (and each
    # row's 128 bytes are one request). In ROWS_LAYOUT (rows r, r + 1 per 8 lanes: 2-way
    # conflicts, as its loads had) the kernel took 5–6% longer: H200, topk 2048, B=128 × 128
    # heads 257.9 vs 242.1 µs, B=64 × 64 heads 80.4 vs 76.0 (h200-20261201-s15-a6cb0db-sparse-
    # sm90-ab.json)
    GATHER_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [8, 1], [1, 0]))
    # the fp8 format's 64-byte rope rows, gathered the same way: 4 lanes a row
    GATHER64 = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0]))
    # [BN, 128]-byte chunks of the fp8 ring as the conversion reads them (and the fp16 it
    # stores): 8 contiguous bytes per thread; a warp's lanes cover 64 bytes of rows r, r ^ 4,
    # r ^ 1, r ^ 5, its registers the other 64 bytes and row r ^ 2. Under the 128-byte swizzle
    # (16-byte chunk j of row r at j ^ (r % 8)) the 16 lanes of one 8-byte load then hit 16
    # different bank pairs, and the 8 lanes of one 16-byte fp16 store 8 different chunks.
    # ROWS_LAYOUT (16 bytes per thread, rows r and r + 1 in each group of 8 lanes) made every
    # ring load a 2-way bank conflict (Nsight Compute, h200-20261201-s14-9f19755-ncu-*: 2.10 M
    # sparse / 4.19 M dense extra wavefronts, exactly 4 per 16-byte load); no layout of 16
    # bytes per thread avoids conflicts on both the loads and the fp16 stores
    RING_LAYOUT = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 64], [2, 0]],
        lane_bases=[[0, 8], [0, 16], [0, 32], [4, 0], [1, 0]],
        warp_bases=[[8, 0], [16, 0], [32, 0]], block_bases=[], shape=[64, 128]))
    SHARED16 = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                 rank=2))
    # O's rows for a bf16 store in dim order, 8 consecutive dims a thread (one 16-byte store;
    # lanes 4g + t hold rows g and g + 8, dims 8 · (t // 2) … of each 16): the accumulator's
    # registers and lanes relabelled within each warp (`IN_ORDER`)
    O_ROWS = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 16], [0, 32], [0, 64], [0, 128]],
        lane_bases=[[8, 0], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0], [0, 256]], block_bases=[], shape=[64, 512]))

    @gluon.jit
    def _tile_row(bt_row, pos, end, page_shift):
        """Pool row of position ``pos`` through the block table (0 from ``end`` on)."""
        page = gl.load(bt_row + (pos >> page_shift), mask=pos < end, other=0)
        return (page << page_shift) + (pos & ((1 << page_shift) - 1))

    @gluon.jit
    def _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, stage, row0, pred,
               BN: gl.constexpr):
        """Copy the tile at pool row ``row0`` into ring stage ``stage`` (when ``pred``)."""
        bar = bars.index(stage)
        mbarrier.expect(bar, BN * 576, pred=pred)
        for c in gl.static_range(4):
            _tma_load(lat_desc, [row0, c * 128], bar, lat_buf.index(stage * 4 + c), pred=pred)
        _tma_load(rope_desc, [row0, 512], bar, rope_buf.index(stage), pred=pred)

    @gluon.jit
    def _convert(lat_buf, rope_buf, stage, k_lat_s, k_rope_s, rows, MASK: gl.constexpr,
                 RING: gl.constexpr = RING_LAYOUT, ROPE: gl.constexpr = ROWS_LAYOUT):
        """Ring stage ``stage``'s e4m3 tile → fp16 in k_lat_s / k_rope_s (MASK: rows from
        ``rows`` on as zeros — whatever bytes a page holds past a request's end). RING / ROPE:
        the layouts of the latent chunks' and the rope's loads (8 warps by default)."""
        t = gl.arange(0, lat_buf.shape[1], layout=gl.SliceLayout(1, RING))
        for c in gl.static_range(4):
            x = lat_buf.index(stage * 4 + c).load(RING).to(gl.float8e4nv, bitcast=True)
            x = x.to(gl.float16)
            if MASK:
                x = gl.where((t < rows)[:, None], x, 0.0)
            k_lat_s.slice(c * 128, 128, dim=1).store(x)
        t = gl.arange(0, rope_buf.shape[1], layout=gl.SliceLayout(1, ROPE))
        x = rope_buf.index(stage).load(ROPE).to(gl.float8e4nv, bitcast=True)
        x = x.to(gl.float16)
        if MASK:
            x = gl.where((t < rows)[:, None], x, 0.0)
        k_rope_s.store(x)

    @gluon.jit
    def _dense_ring(lat_desc, rope_desc, bt_ptr, seqlens_ptr, scale_ptr, b, lag, split,
                    num_splits, stride_bt, page_shift, max_len, BN: gl.constexpr):
        """A dense TMA loop's two-stage ring (latent and rope buffers, initialised mbarriers),
        this program's token chunk from the device-side length (bounded by the table's row,
        less ``lag``: `_query_program`), and its first tile's copy issued: (lat_buf, rope_buf,
        bars, seqlen, start, end, n_tiles, the request's block-table row, the pool's scale
        from ``scale_ptr``)."""
        lat_buf = gl.allocate_shared_memory(gl.uint8, [2 * 4, BN, 128], lat_desc.layout)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [2, BN, 64], rope_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(2):
            mbarrier.init(bars.index(j), count=1)
        fence_async_shared()  # the initialised barriers (and q), before the async proxy
        seqlen = gl.maximum(gl.minimum(gl.load(seqlens_ptr + b), max_len) - lag, 0)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BN)
        kv_mult = gl.load(scale_ptr)
        bt_row = bt_ptr + b.to(gl.int64) * stride_bt
        _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, 0,
               _tile_row(bt_row, start, end, page_shift), n_tiles > 0, BN)
        return lat_buf, rope_buf, bars, seqlen, start, end, n_tiles, bt_row, kv_mult

    @gluon.jit
    def _next_tile(lat_desc, rope_desc, lat_buf, rope_buf, bars, k_lat_s, k_rope_s, acc, p_s,
                   bt_row, i, n0, end, n_tiles, page_shift, BN: gl.constexpr,
                   RING: gl.constexpr = RING_LAYOUT, ROPE: gl.constexpr = ROWS_LAYOUT):
        """Tile i (positions n0 …) of a dense TMA loop into k_lat_s / k_rope_s, ready for the
        products: the next tile's copy issued into the other ring stage, this one's waited
        for, the last tile's P · V waited for (it ran during both: H200, B=64 × 8K × 128 heads
        456.4 → 414.7 µs, h200-20261201-s14-5f55f95-dense-ab), then converted (rows past
        ``end`` zeroed) and fenced behind a CTA barrier. Returns the accumulator."""
        stage = i % 2
        _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, 1 - stage,
               _tile_row(bt_row, n0 + BN, end, page_shift), i + 1 < n_tiles, BN)
        mbarrier.wait(bars.index(stage), (i // 2) & 1)
        acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
        _cta_barrier()  # every warpgroup is done with the last tile's buffers
        if n0 + BN <= end:
            _convert(lat_buf, rope_buf, stage, k_lat_s, k_rope_s, BN, False, RING, ROPE)
        else:  # the request's partial last tile: rows past its end are zeroed, not used
            _convert(lat_buf, rope_buf, stage, k_lat_s, k_rope_s, end - n0, True, RING, ROPE)
        fence_async_shared()
        _cta_barrier()
        return acc

    @gluon.jit
    def _softmax_state(HEADS: gl.constexpr, BN: gl.constexpr):
        """The tile loop's carried state: running max −inf, row sums 0, the accumulator 0 as
        a P · V token, and P's shared-memory buffer (the product's A operand)."""
        p_s = gl.allocate_shared_memory(gl.float16, [HEADS, BN], SHARED16)
        acc = warpgroup_mma_init(gl.zeros([HEADS, 512], gl.float32, layout=O_LAYOUT))
        return (gl.full([HEADS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT)),
                gl.full([HEADS], 0.0, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT)), acc, p_s)

    @gluon.jit
    def _stamp(stamp_ptr, k: gl.constexpr):
        """Debug timeline (``TIMELINE`` kernels; `benchmarks/timeline.py` reads it): the global
        timer (ns) into stamp_ptr[2k] and this SM's clock into stamp_ptr[2k + 1] — every thread
        stores its own reading, so a stamp with no barrier before it is some warp's."""
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                        is_pure=False, pack=1)
        clk = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64,
                                        is_pure=False, pack=1)
        gl.store(stamp_ptr + 2 * k, now)
        gl.store(stamp_ptr + 2 * k + 1, clk)

    @gluon.jit
    def _launch_dependents():
        """Programmatic dependent launch: let the split combine (this grid's programmatic
        dependent) start launching once every program has passed this point — its programs
        wait in `gdc_wait` for the whole grid's writes, so where this sits changes when they
        launch, never what they read."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _split_range(seqlen, split, num_splits, BN: gl.constexpr):
        """(start, end, tiles) of split ``split``'s token chunk: whole tiles per split, as
        `_mla_decode_kernel` takes them, from the device-side length."""
        chunk = gl.cdiv(gl.cdiv(seqlen, num_splits), BN) * BN
        start = split * chunk
        end = gl.minimum(seqlen, start + chunk)
        return start, end, gl.cdiv(gl.maximum(end - start, 0), BN)

    @gluon.jit
    def _q_rows(q_ptr, b, qi, hb, stride_qb, stride_qs, stride_qh, num_heads,
                HEADS: gl.constexpr, S_Q: gl.constexpr = 1, PACK: gl.constexpr = False):
        """This program's q rows (request b's rows `_row_ids`: query qi's heads hb · HEADS …,
        or, ``PACK``, every query's), whether each exists, and the column offsets of a 128- and
        a 64-wide block, all in ROWS_LAYOUT."""
        r = gl.arange(0, HEADS, layout=gl.SliceLayout(1, ROWS_LAYOUT))
        q_i, h, ok = _row_ids(r, qi, hb, num_heads, S_Q, HEADS, PACK)
        c128 = gl.arange(0, 128, layout=gl.SliceLayout(0, ROWS_LAYOUT))
        c64 = gl.arange(0, 64, layout=gl.SliceLayout(0, ROWS_LAYOUT))
        row = b.to(gl.int64) * stride_qb + q_i * stride_qs + h * stride_qh
        return q_ptr + row, ok, c128, c64

    @gluon.jit
    def _query_program(S_Q: gl.constexpr, CAUSAL: gl.constexpr, PACK: gl.constexpr = False):
        """(head block, query, lag) of this program from grid axis 2 (head blocks × S_Q,
        the query fastest): query s of S_Q sees its request's first length − lag tokens (lag
        S_Q − 1 − s when CAUSAL, as MTP's drafts do; 0 otherwise). ``PACK``: one program holds
        every query's heads (`_row_ids`), its tiles the longest query's: (0, 0, 0)."""
        pid = gl.program_id(2)
        s = pid % S_Q
        lag = s * 0
        if CAUSAL:
            if not PACK:
                lag = S_Q - 1 - s
        return pid // S_Q, s, lag

    @gluon.jit
    def _row_ids(r, qi, hb, num_heads, S_Q: gl.constexpr, HEADS: gl.constexpr,
                 PACK: gl.constexpr):
        """Program rows r's (query, head) and whether each exists: heads hb · HEADS + r of
        query qi, or, ``PACK``, rows in [S_Q, num_heads] order (query r // num_heads, head
        r % num_heads: every query's heads of one request, S_Q · num_heads ≤ HEADS)."""
        if PACK:
            return r // num_heads, r % num_heads, r < S_Q * num_heads
        h = hb * HEADS + r
        return r * 0 + qi, h, h < num_heads

    @gluon.jit
    def _row_keep(n0, cols, end, seqlen, r, num_heads, S_Q: gl.constexpr,
                  CAUSAL: gl.constexpr, PACK: gl.constexpr):
        """Which score columns (positions n0 + cols) each row attends, broadcastable to
        [HEADS, BN] in S_LAYOUT: those before the split's ``end``, and, ``PACK`` and CAUSAL,
        before each row's own query's length (seqlen − S_Q + 1 + its query; ``r``: the rows in
        S_LAYOUT's row slice)."""
        pos = n0 + cols
        keep = (pos < end)[None, :]
        if PACK:
            if CAUSAL:
                last = gl.minimum(end, seqlen - S_Q + 1 + r // num_heads)
                keep = pos[None, :] < last[:, None]
        return keep

    @gluon.jit
    def _q_latent(q_row, h_ok, c128, HEADS: gl.constexpr):
        """q's 512 latent dims as an fp16 shared-memory operand [HEADS, 512]."""
        q_lat_s = gl.allocate_shared_memory(gl.float16, [HEADS, 512], SHARED16)
        for c in gl.static_range(4):
            x = gl.load(q_row[:, None] + c * 128 + c128[None, :], mask=h_ok[:, None], other=0.0)
            q_lat_s.slice(c * 128, 128, dim=1).store(x.to(gl.float16))
        return q_lat_s

    @gluon.jit
    def _softmax_pv(s, keep, qk_scale, m_i, l_i, acc, k_lat_s, p_s):
        """One tile of the online softmax (base 2; scores where ``keep`` — [HEADS, BN] or
        [1, BN] — is False are −inf, and a tile of none while nothing was kept before leaves
        the state as it is) and P · V into ``acc``, left running: (running max, row sums,
        the product's token — to wait for before k_lat_s or p_s is written again or the
        accumulator read). Each warpgroup stores its own score columns of P into ``p_s``, the
        product's shared-memory A operand (exchanging them between the warpgroups' registers
        instead took two rounds through scratch and 4 more CTA barriers per tile: 2–3% slower,
        H200 B=64 × 8K × 128 heads 414.6 → 403.3 µs, sparse B=128 × 128 heads 269.9 → 265.0,
        h200-20261201-s15-e4d92ad-dense-ab.json / -sparse-sm90-ab.json)."""
        s = gl.where(keep, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no −inf − −inf
        p = gl.exp2(s - m_ref[:, None])
        alpha = gl.exp2(m_i - m_ref)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        a = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
        p_s.store(p.to(gl.float16))
        fence_async_shared()
        _cta_barrier()
        return m_new, l_i, warpgroup_mma(p_s, k_lat_s, acc * a[:, None], is_async=True)

    @gluon.jit
    def _store_o(ptr, row_off, ok, o, IN_ORDER: gl.constexpr):
        """Store O ([HEADS, 512] float32 in O_LAYOUT) as ``ptr``'s dtype at ptr + row_off[r] +
        dim for the rows where ``ok`` (both in O_LAYOUT's row slice): in the accumulator's own
        layout (two consecutive dims a thread and store), or, where IN_ORDER and the dtype is
        16-bit, through O_ROWS (one 16-byte store for 8 dims; float32 stays in place: its
        in-order compile spills, sm_90, triton 3.6 and 3.9)."""
        x = o.to(ptr.dtype.element_ty)
        if IN_ORDER and ptr.dtype.element_ty.primitive_bitwidth == 16:
            x = gl.convert_layout(x, O_ROWS)
            row_off = gl.convert_layout(row_off, gl.SliceLayout(1, O_ROWS))
            ok = gl.convert_layout(ok, gl.SliceLayout(1, O_ROWS))
            c = gl.arange(0, 512, layout=gl.SliceLayout(0, O_ROWS))
        else:
            c = gl.arange(0, 512, layout=gl.SliceLayout(0, O_LAYOUT))
        gl.store(ptr + row_off[:, None] + c[None, :], x, mask=ok[:, None])

    @gluon.jit
    def _write_rows(acc, m_i, l_i, kv_mult, b, qi, split, hb, out_ptr, lse_ptr, max_ptr,
                    part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os, stride_oh,
                    stride_lb, stride_ls, stride_lh, lse_empty, num_heads, num_splits,
                    DIRECT: gl.constexpr, HEADS: gl.constexpr, IN_ORDER: gl.constexpr,
                    S_Q: gl.constexpr, PACK: gl.constexpr = False):
        """Normalize; write the program's final rows (`_row_ids`: query qi's heads, or,
        ``PACK``, every query's; one split: out, lse — ``lse_empty`` where nothing was
        attended — and max_logits [batch, S_Q, num_heads]) or this split's partial for the
        combine (workspace rows [batch, num_splits, S_Q, num_heads]); O's rows as `_store_o`
        (IN_ORDER) stores them."""
        has = l_i != 0.0  # NaN (a NaN score) too: its lse stays NaN, not the empty row's −inf
        lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
        inv = gl.convert_layout(gl.where(has, kv_mult / gl.where(has, l_i, 1.0), 0.0),
                                gl.SliceLayout(1, O_LAYOUT))
        qs, hs, oks = _row_ids(gl.arange(0, HEADS, layout=gl.SliceLayout(1, S_LAYOUT)), qi, hb,
                               num_heads, S_Q, HEADS, PACK)
        qo, ho, oko = _row_ids(gl.arange(0, HEADS, layout=gl.SliceLayout(1, O_LAYOUT)), qi, hb,
                               num_heads, S_Q, HEADS, PACK)
        o = acc * inv[:, None]
        if DIRECT:
            _store_o(out_ptr, b.to(gl.int64) * stride_ob + qo * stride_os + ho * stride_oh,
                     oko, o, IN_ORDER)
            gl.store(lse_ptr + b.to(gl.int64) * stride_lb + qs * stride_ls + hs * stride_lh,
                     gl.where(has, lse, lse_empty), mask=oks)
            gl.store(max_ptr + (b * S_Q + qs).to(gl.int64) * num_heads + hs, m_i / LOG2E,
                     mask=oks)
        else:
            rows = (b * num_splits + split) * S_Q  # the split's first workspace row, query 0
            ws = (rows + qs).to(gl.int64) * num_heads + hs
            gl.store(part_lse_ptr + ws, lse, mask=oks)
            gl.store(part_max_ptr + ws, m_i / LOG2E, mask=oks)
            _store_o(part_out_ptr, ((rows + qo).to(gl.int64) * num_heads + ho) * 512, oko, o,
                     IN_ORDER)

    @gluon.jit
    def _mla_decode_sm90_kernel(
        q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, scale_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qs, stride_qh, stride_bt, stride_ob, stride_os, stride_oh, stride_lb,
        stride_ls, stride_lh, softmax_scale, lse_empty, num_heads, num_splits, page_shift,
        max_len, DIRECT: gl.constexpr, HEADS: gl.constexpr, BN: gl.constexpr,
        PDL: gl.constexpr = False, IN_ORDER: gl.constexpr = True, S_Q: gl.constexpr = 1,
        CAUSAL: gl.constexpr = True, PACK: gl.constexpr = False,
    ):
        b = gl.program_id(0)
        split = gl.program_id(1)
        hb, qi, lag = _query_program(S_Q, CAUSAL, PACK)

        # q: latent and rope as fp16 shared-memory operands
        q_row, h_ok, c128, c64 = _q_rows(q_ptr, b, qi, hb, stride_qb, stride_qs, stride_qh,
                                         num_heads, HEADS, S_Q, PACK)
        q_lat_s = _q_latent(q_row, h_ok, c128, HEADS)
        x = gl.load(q_row[:, None] + 512 + c64[None, :], mask=h_ok[:, None], other=0.0)
        q_rope_s = gl.allocate_shared_memory(gl.float16, [HEADS, 64], SHARED16, x.to(gl.float16))
        k_lat_s = gl.allocate_shared_memory(gl.float16, [BN, 512], SHARED16)
        k_rope_s = gl.allocate_shared_memory(gl.float16, [BN, 64], SHARED16)
        lat_buf, rope_buf, bars, seqlen, start, end, n_tiles, bt_row, kv_mult = _dense_ring(
            lat_desc, rope_desc, bt_ptr, seqlens_ptr, scale_ptr, b, lag, split, num_splits,
            stride_bt, page_shift, max_len, BN)
        qk_scale = softmax_scale * kv_mult * LOG2E

        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_LAYOUT))
        rs = gl.arange(0, HEADS, layout=gl.SliceLayout(1, S_LAYOUT))
        m_i, l_i, acc, p_s = _softmax_state(HEADS, BN)
        for i in range(n_tiles):
            n0 = start + i * BN
            # the next tile's copy: its ring stage was last converted before the last tile's
            # barrier (looking its pool row up a tile earlier measured the same: 414.9 / 414.9
            # vs 414.7 / 414.3 µs, h200-20261201-s14-4a1dbdc-dense-ab.json)
            acc = _next_tile(lat_desc, rope_desc, lat_buf, rope_buf, bars, k_lat_s, k_rope_s,
                             acc, p_s, bt_row, i, n0, end, n_tiles, page_shift, BN)
            s = gl.zeros([HEADS, BN], gl.float32, layout=S_LAYOUT)
            s = warpgroup_mma(q_lat_s, k_lat_s.permute((1, 0)), s)
            s = warpgroup_mma(q_rope_s, k_rope_s.permute((1, 0)), s)
            keep = _row_keep(n0, cols, end, seqlen, rs, num_heads, S_Q, CAUSAL, PACK)
            m_i, l_i, acc = _softmax_pv(s, keep, qk_scale, m_i, l_i, acc, k_lat_s, p_s)
        acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
        for j in gl.static_range(2):
            mbarrier.invalidate(bars.index(j))
        if PDL:
            _launch_dependents()

        _write_rows(acc, m_i, l_i, kv_mult, b, qi, split, hb, out_ptr, lse_ptr, max_ptr,
                    part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os, stride_oh,
                    stride_lb, stride_ls, stride_lh, lse_empty, num_heads, num_splits, DIRECT,
                    HEADS, IN_ORDER, S_Q, PACK)

    REINTERPRET_NEW = gl.constexpr(_NEW_REINTERPRET)

    @gluon.jit
    def _gather(u8_ptr, lat_buf, rope_buf, stage, slot, ok, c128, DS: gl.constexpr):
        """cp.async of one tile's rows (slots ``slot`` where ``ok``, zeros elsewhere) into ring
        stage ``stage``: four 128-byte latent chunks and the rope — fp8_ds_mla's (``DS``)
        128-byte bf16 rope after the scales, or the fp8 format's 64 e4m3 bytes (copied in
        GATHER64's rows); one commit group. (One 512-byte copy per row into a [BN, 512] stage
        removed three CTA barriers per tile and measured the same: 270.5 vs 269.9 µs,
        h200-20261201-s15-e4d92ad-sparse-sm90-ab.json.)"""
        row_bytes: gl.constexpr = 656 if DS else 576
        row = u8_ptr + slot.to(gl.int64)[:, None] * row_bytes + c128[None, :]
        for c in gl.static_range(4):
            _cp_async(lat_buf.index(stage * 4 + c), row + c * 128, mask=ok[:, None])
        if DS:
            _cp_async(rope_buf.index(stage), row + 528, mask=ok[:, None])
        else:
            slot64 = gl.convert_layout(slot, gl.SliceLayout(1, GATHER64))
            ok64 = gl.convert_layout(ok, gl.SliceLayout(1, GATHER64))
            c64 = gl.arange(0, 64, layout=gl.SliceLayout(0, GATHER64))
            rope = u8_ptr + slot64.to(gl.int64)[:, None] * row_bytes + 512 + c64[None, :]
            _cp_async(rope_buf.index(stage), rope, mask=ok64[:, None])
        async_copy.commit_group()

    @gluon.jit
    def _row_scales(f32_ptr, slot, ok):
        """The four float32 scales of fp8_ds_mla rows at ``slot`` (one per 128 latent dims), as
        fp16 [BN] each; 0 where not ``ok``."""
        srow = f32_ptr + slot.to(gl.int64) * 164 + 128
        return (gl.load(srow, mask=ok, other=0.0).to(gl.float16),
                gl.load(srow + 1, mask=ok, other=0.0).to(gl.float16),
                gl.load(srow + 2, mask=ok, other=0.0).to(gl.float16),
                gl.load(srow + 3, mask=ok, other=0.0).to(gl.float16))

    @gluon.jit
    def _store_scaled(lat_buf, k_lat_s, stage, c: gl.constexpr, sc,
                      RING: gl.constexpr = RING_LAYOUT):
        """Ring stage ``stage``'s latent chunk c (e4m3) × its rows' scales ``sc`` → fp16 in
        k_lat_s (RING: the chunk's load layout)."""
        w = lat_buf.index(stage * 4 + c).load(RING).to(gl.float8e4nv, bitcast=True)
        k_lat_s.slice(c * 128, 128, dim=1).store(w.to(gl.float16) * sc[:, None])

    @gluon.jit
    def _entries(list_row, pos, end, num_slots):
        """Index-list entries at positions ``pos`` and whether each is attended: before
        ``end`` and a slot inside the pool (−1 or any other slot outside it: skipped)."""
        slot = gl.load(list_row + pos, mask=pos < end, other=-1)
        return slot, (slot >= 0) & (slot < num_slots)

    @gluon.jit
    def _list_entries(list_row, pos, end, num_slots, page_shift, PAGED: gl.constexpr):
        """`_entries` of an index list, or, ``PAGED``, of a block-table row: the pool rows of
        token positions ``pos`` (`_tile_row`), attended before ``end`` where inside the pool."""
        if PAGED:
            slot = _tile_row(list_row, pos, end, page_shift)
            ok = (pos < end) & (slot >= 0) & (slot < num_slots)
        else:
            slot, ok = _entries(list_row, pos, end, num_slots)
        return slot, ok

    @gluon.jit
    def _mla_sparse_sm90_kernel(
        q_ptr, u8_ptr, f32_ptr, list_ptr, count_ptr, scale_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qs, stride_qh, stride_list, stride_ob, stride_os, stride_oh,
        stride_lb, stride_ls, stride_lh, softmax_scale, lse_empty, num_heads, num_splits,
        max_len, num_slots, page_shift, DIRECT: gl.constexpr, HEADS: gl.constexpr,
        BN: gl.constexpr, PDL: gl.constexpr = False, IN_ORDER: gl.constexpr = True,
        PAGED: gl.constexpr = False, S_Q: gl.constexpr = 1, CAUSAL: gl.constexpr = True,
        DS: gl.constexpr = True, PACK: gl.constexpr = False,
    ):
        """Sparse decode over index lists (fp8_ds_mla rows, 656 bytes: e4m3 latent, four
        float32 scales per 128 dims, bf16 rope): the layouts of `_mla_decode_sm90_kernel`,
        with each tile's rows gathered by cp.async (one row per list entry: TMA cannot gather
        on SM90) into a two-stage ring, the entries read two tiles ahead in the gather's
        layout and once more, a tile ahead, in the conversion's for the scales and the flags
        (a second load of cached entries instead of a layout conversion through shared
        memory). Entries are checked here (−1 and slots outside the pool are skipped: not
        copied, their scale 0, their score −inf: each tile's flags pass through 64 bytes of
        shared memory into the score layout). Each 128-dim chunk is converted once, times its
        row's scale (in fp16, as the Triton kernel's 64-row path), and the bf16 rope enters a
        bf16 wgmma straight from the ring. The rows' scales are loaded one tile ahead, beside the next tile's
        gather (loaded after the ring's wait, at the conversion, they cost 11%: B=128 × 128
        heads 329.7 → 294.7 µs, h200-20261201-s14-1a03a1b-sparse-sm90-ab.json), and each
        tile's P · V runs on while the next tile's gather and scale loads issue (waited for
        there: 297 → 271 µs, h200-20261201-s14-e9623e2-sparse-sm90-variants.json; starting
        q · Kᵀ's first half before the second half's conversion measured 1% slower; issuing
        the first gather before loading q, the same: B=64 × 64 heads 82.0 / 81.9 vs 81.7 /
        81.5 µs, h200-20261201-s15-067970b-sparse-sm90-ab.json).

        ``PAGED``: dense decode of fp8_ds_mla rows (`fp8mla.decode.SM90_DS_PAGED`) — list_ptr
        and stride_list are the block table, count_ptr the lengths, max_len the tokens the
        table's row covers, and each position's pool row is looked up through its page
        (``page_shift``: log2 of the page size; any size, one row a gather either way), and
        S_Q queries a request as the dense kernel takes them (`_query_program`; index lists:
        one). Not ``DS``: rows of the fp8 format (576 bytes, e4m3 latent and rope, the pool's
        scale at ``scale_ptr`` folded into the scores and the output, as the dense kernel
        does), the rope gathered and converted beside the latent. (fp8_ds_mla plans pass a
        scale of 1.)"""
        b = gl.program_id(0)
        split = gl.program_id(1)
        hb, qi, lag = _query_program(S_Q, CAUSAL, PACK)
        sh8: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                                 rank=2)
        lat_buf = gl.allocate_shared_memory(gl.uint8, [2 * 4, BN, 128], sh8)
        if DS:  # the bf16 rope, multiplied straight from the ring
            rope_buf = gl.allocate_shared_memory(gl.uint8, [2, BN, 128], sh8)
        else:  # the e4m3 rope, converted to fp16 in k_rope_s
            sh8r: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64,
                                                      element_bitwidth=8, rank=2)
            rope_buf = gl.allocate_shared_memory(gl.uint8, [2, BN, 64], sh8r)
            k_rope_s = gl.allocate_shared_memory(gl.float16, [BN, 64], SHARED16)
        flags = gl.allocate_shared_memory(gl.int8, [BN], gl.SwizzledSharedLayout(1, 1, 1, [0]))

        q_row, h_ok, c128, c64 = _q_rows(q_ptr, b, qi, hb, stride_qb, stride_qs, stride_qh,
                                         num_heads, HEADS, S_Q, PACK)
        q_lat_s = _q_latent(q_row, h_ok, c128, HEADS)
        qr = gl.load(q_row[:, None] + 512 + c64[None, :], mask=h_ok[:, None], other=0.0)
        if DS:
            q_rope_s = gl.allocate_shared_memory(gl.bfloat16, [HEADS, 64], SHARED16, qr)
        else:
            q_rope_s = gl.allocate_shared_memory(gl.float16, [HEADS, 64], SHARED16,
                                                 qr.to(gl.float16))
        kv_mult = gl.load(scale_ptr)

        seqlen = gl.maximum(gl.minimum(gl.load(count_ptr + b), max_len) - lag, 0)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BN)
        list_row = list_ptr + b.to(gl.int64) * stride_list
        t = gl.arange(0, BN, layout=gl.SliceLayout(1, GATHER_LAYOUT))  # the gather's rows
        cg = gl.arange(0, 128, layout=gl.SliceLayout(0, GATHER_LAYOUT))
        slot, ok = _list_entries(list_row, start + t, end, num_slots, page_shift, PAGED)
        _gather(u8_ptr, lat_buf, rope_buf, 0, slot, ok, cg, DS)
        slot_next, ok_next = _list_entries(list_row, start + BN + t, end, num_slots, page_shift,
                                           PAGED)
        tr = gl.arange(0, BN, layout=gl.SliceLayout(1, RING_LAYOUT))  # the conversion's rows
        slot_r, keep_r = _list_entries(list_row, start + tr, end, num_slots, page_shift, PAGED)
        if DS:
            sa, sb, sc, sd = _row_scales(f32_ptr, slot_r, keep_r)
        k_lat_s = gl.allocate_shared_memory(gl.float16, [BN, 512], SHARED16)
        qk_scale = softmax_scale * kv_mult * LOG2E
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_LAYOUT))
        rs = gl.arange(0, HEADS, layout=gl.SliceLayout(1, S_LAYOUT))

        m_i, l_i, acc, p_s = _softmax_state(HEADS, BN)
        for i in range(n_tiles):
            n0 = start + i * BN
            stage = i % 2
            _gather(u8_ptr, lat_buf, rope_buf, 1 - stage, slot_next, ok_next, cg, DS)
            slot_far, ok_far = _list_entries(list_row, n0 + 2 * BN + t, end, num_slots,
                                             page_shift, PAGED)
            slot_r, keep_next = _list_entries(list_row, n0 + BN + tr, end, num_slots,
                                              page_shift, PAGED)
            if DS:
                na, nb, nc, nd = _row_scales(f32_ptr, slot_r, keep_next)
            # the last tile's P · V ran during the issues above
            acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
            async_copy.wait_group(1)  # this tile's group (the next one may be in flight)
            _cta_barrier()
            if DS:
                _store_scaled(lat_buf, k_lat_s, stage, 0, sa)
                _store_scaled(lat_buf, k_lat_s, stage, 1, sb)
                _store_scaled(lat_buf, k_lat_s, stage, 2, sc)
                _store_scaled(lat_buf, k_lat_s, stage, 3, sd)
                sa, sb, sc, sd = na, nb, nc, nd
            else:  # (rows not copied are zeros: nothing to mask)
                _convert(lat_buf, rope_buf, stage, k_lat_s, k_rope_s, BN, False)
            flags.store(keep_r.to(gl.int8))  # this tile's entries: attended or not
            fence_async_shared()
            _cta_barrier()
            keep = (flags.load(gl.SliceLayout(0, S_LAYOUT)) != 0)[None, :]
            if PACK:  # each row's own query's length (the flags: the longest query's)
                if CAUSAL:
                    keep = keep & _row_keep(n0, cols, end, seqlen, rs, num_heads, S_Q, CAUSAL,
                                            PACK)
            if DS:
                if REINTERPRET_NEW:
                    k_rope_s = rope_buf.index(stage).reinterpret(gl.bfloat16, [BN, 64],
                                                                 SHARED16)
                else:
                    k_rope_s = rope_buf.index(stage)._reinterpret(gl.bfloat16, [BN, 64],
                                                                  SHARED16)
            s = gl.zeros([HEADS, BN], gl.float32, layout=S_LAYOUT)
            s = warpgroup_mma(q_lat_s, k_lat_s.permute((1, 0)), s)
            s = warpgroup_mma(q_rope_s, k_rope_s.permute((1, 0)), s)
            m_i, l_i, acc = _softmax_pv(s, keep, qk_scale, m_i, l_i, acc, k_lat_s, p_s)
            slot_next, ok_next, keep_r = slot_far, ok_far, keep_next
        acc = warpgroup_mma_wait(0, deps=[acc, p_s, k_lat_s])[0]
        async_copy.wait_group(0)
        if PDL:
            _launch_dependents()

        _write_rows(acc, m_i, l_i, kv_mult, b, qi, split, hb, out_ptr, lse_ptr, max_ptr,
                    part_out_ptr, part_lse_ptr, part_max_ptr, stride_ob, stride_os, stride_oh,
                    stride_lb, stride_ls, stride_lh, lse_empty, num_heads, num_splits, DIRECT,
                    HEADS, IN_ORDER, S_Q, PACK)
