"""SM90 dense fp8 decode for programs of ≤ 8 or 9–16 query rows (the 8-row and wide forms of
`decode_sm90_mma8`) as one program an SM of two warp groups that take alternate tiles from one
shared ring (warp specialization: a default and a worker partition of 4 warps each).

Why: two independent 4-warp programs an SM do not share it evenly — the one the block scheduler
placed second leaves ~9 µs after the first at B=64 × 8K × 16 heads and ~2.5 µs at B=1 × 128K ×
8, and the 8-row form's loops at B=64 × 8K × 8 end anywhere from 51 to 72 µs; those last µs run
on SMs left with one program (`benchmarks/timeline.py`, BENCHMARKS.md session 23). Here the two
groups are tied through the ring: a group, starting its tile i (i ≥ 2), refills the stage of
its tile i − 2 with tile i − 2 + NS, and with an odd NS that tile is the other group's — a
group can run ahead of the other by no more than the ring holds, so both end together.

Each group keeps its own online-softmax state over its tiles and writes it as a split's
partial (split 2p + g of program p, group g), merged by `_combine_splits_kernel` like any
other. Per tile a group does what a program of the same rows does in `decode_sm90_mma8` (K · qᵀ
by mma.sync, qᵀ held in registers at 8 rows and read from shared memory at 16; P through shared
memory; Vᵀ · Pᵀ), its CTA barriers the partition's own (named barriers of 128 threads).
Shared memory: the ring (5 × 36 KB), q (32 KB at 8 rows, staged as the 8-row form does in a
stage's bytes; 18 KB at 16), the groups' P — 221.5 / 211.5 KB of the SM's 227: no room for a
sixth stage.

Status: built in session 29 and off by default (`fp8mla.decode.SM90_MMA8_PAIR`,
`SM90_MMA16_PAIR`); compiled for sm_90 (triton 3.6 and 3.9, no spills), its ring protocol
modelled, not yet run on a GPU in this form (its first form hung: the barriers below).

The ring's barriers: a stage's uses alternate between the groups, so one barrier a stage would
let a group at tile i find it a phase behind (tile i − NS, the other group's, not landed yet) and
a parity wait for tile i pass on tile i − 2NS's completed phase. Each stage has two barriers
instead, taken by turns (`ring_slot`): a barrier then serves every other use of its stage — one
group's tiles only — and is re-armed for a tile only after that group consumed the tile before
it, so its pending phase is always the awaited tile's (a model of the protocol:
tests/test_pair_ring.py).
"""

from fp8mla.kernels.decode_sm90 import AVAILABLE

STAGES = 5  # ring stages shared by the two groups (odd: the groups' tiles alternate per stage)
GROUP_WARPS = 4  # warps a group (the kernel's num_warps: the default partition's)
WORKER_REGS = 232  # registers a thread of the worker partition


def ring_slot(i: int, ns: int) -> tuple[int, int, int]:
    """(stage, barrier, wait parity) of tile i in a ring of ``ns`` stages with two barriers a
    stage taken by turns — what `_slot` computes in the kernel."""
    use = i // ns
    return i % ns, i % ns + ns * (use % 2), (use // 2) % 2


if AVAILABLE:
    from fp8mla.kernels.decode_sm90 import (
        LOG2E,
        _cta_barrier,
        _split_range,
        _stamp,
        _tile_row,
        _tma_load,
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
        Q_WIDE_STORE_LAT,
        Q_WIDE_STORE_ROPE,
        _fresh_state,
        _pv_tile,
        _q_operands,
        _scores_mma,
        _softmax_tile,
        _stage_q,
        _stamp_exit,
        _tile_masks,
        _write_rows,
    )

    @gluon.jit
    def _slot(i, NS: gl.constexpr):
        """`ring_slot`: tile i's (stage, barrier index, wait parity)."""
        use = i // NS
        return i % NS, i % NS + NS * (use % 2), (use // 2) & 1

    @gluon.jit
    def _copy(lat_desc, rope_desc, lat_buf, rope_buf, bars, i, row0, pred, NS: gl.constexpr):
        """Copy tile i (pool row ``row0``) into its stage, counted on its barrier (when
        ``pred``): one [4, 64, 128]-byte latent box and the [64, 64]-byte rope box."""
        stage, b_i, _ = _slot(i, NS)
        bar = bars.index(b_i)
        mbarrier.expect(bar, BN * 576, pred=pred)
        _tma_load(lat_desc, [0, row0, 0], bar, lat_buf.index(stage), pred=pred)
        _tma_load(rope_desc, [row0, 512], bar, rope_buf.index(stage), pred=pred)

    @gluon.jit
    def _group(g, lat_desc, rope_desc, lat_buf, rope_buf, bars, p_s, q_lat, q_rope, bt_row,
               seqlen, start, end, n_tiles, page_shift, qk_scale, kv_mult, b, psplit,
               out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
               stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh, lse_empty,
               num_heads, num_splits, stamp_ptr, S_Q: gl.constexpr, HEADS: gl.constexpr,
               CAUSAL: gl.constexpr, R: gl.constexpr, NS: gl.constexpr,
               TIMELINE: gl.constexpr):
        """Group ``g``'s tiles g, g + 2, … of the program's chunk, its partial written as split
        2 · psplit + g (and, TIMELINE, its stamps in that split's row of ``stamp_ptr``). R = 8:
        qᵀ loaded into registers once from q as the program staged it in ``q_lat`` (a stage's
        32 KB); 16: read from ``q_lat`` / ``q_rope`` every tile."""
        qs, lanes, rope_lanes = _q_operands(q_lat, q_rope, R)
        t, last, last_all, tv = _tile_masks(end, seqlen, num_heads, S_Q, HEADS, CAUSAL, R)
        m_i, l_acc, acc0, acc1, acc2, acc3 = _fresh_state(R)
        # the pool row of this group's first refill (tile g + NS, issued at its tile g + 2)
        row_next = _tile_row(bt_row, start + (g + NS) * BN, end, page_shift)
        n_mine = (n_tiles - g + 1) // 2
        if TIMELINE:
            stamp_ptr += (b * num_splits + 2 * psplit + g).to(gl.int64) * 12
            _stamp(stamp_ptr, 1)
        for j in range(n_mine):
            i = g + 2 * j
            n0 = start + i * BN
            if j > 0:  # every warp of the group is past tile i − 2: refill its stage
                fence_async_shared()
                _cta_barrier()
                nxt = i - 2 + NS
                _copy(lat_desc, rope_desc, lat_buf, rope_buf, bars, nxt, row_next,
                      nxt < n_tiles, NS)
                row_next = _tile_row(bt_row, start + (nxt + 2) * BN, end, page_shift)
            stage, b_i, parity = _slot(i, NS)
            mbarrier.wait(bars.index(b_i), parity)
            if TIMELINE:
                if j == 0:
                    _stamp(stamp_ptr, 2)
            s = _scores_mma(lat_buf.index(stage), rope_buf.index(stage), qs, lanes, rope_lanes,
                            R)
            p, alpha1, m_i, l_acc = _softmax_tile(s, n0, t, last, last_all, qk_scale, m_i,
                                                  l_acc)
            p_buf = p_s.index(2 * g + j % 2)
            p_buf.store(p.to(gl.float16))
            _cta_barrier()  # P is whole
            acc0, acc1, acc2, acc3 = _pv_tile(lat_buf.index(stage), p_buf, n0, end, tv, alpha1,
                                              acc0, acc1, acc2, acc3)
        if TIMELINE:
            _stamp(stamp_ptr, 3)
        _write_rows(acc0, acc1, acc2, acc3, 4 * gl.arange(0, 128, layout=gl.SliceLayout(1, MMA)),
                    1, m_i, gl.sum(l_acc, axis=0), kv_mult, b, 2 * psplit + g,
                    out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh,
                    lse_empty, num_heads, num_splits, False, S_Q, HEADS)
        if TIMELINE:
            _stamp_exit(stamp_ptr)

    WG_WARPS = gl.constexpr(GROUP_WARPS)
    WG_REGS = gl.constexpr(WORKER_REGS)

    # the partitions: the runtime arguments as one tuple, the constexprs and the timeline's
    # pointer beside it (inside a tuple constexprs would arrive as runtime values)
    @gluon.jit
    def _group0(args, stamp_ptr, S_Q: gl.constexpr, HEADS: gl.constexpr, CAUSAL: gl.constexpr,
                R: gl.constexpr, NS: gl.constexpr, TIMELINE: gl.constexpr):
        _group(0, *args, stamp_ptr, S_Q, HEADS, CAUSAL, R, NS, TIMELINE)

    @gluon.jit
    def _group1(args, stamp_ptr, S_Q: gl.constexpr, HEADS: gl.constexpr, CAUSAL: gl.constexpr,
                R: gl.constexpr, NS: gl.constexpr, TIMELINE: gl.constexpr):
        _group(1, *args, stamp_ptr, S_Q, HEADS, CAUSAL, R, NS, TIMELINE)

    @gluon.jit
    def _mla_decode_pair_kernel(
        q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, scale_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qs, stride_qh, stride_bt, stride_ob, stride_os, stride_oh,
        stride_lb, stride_ls, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, page_shift, max_len,
        S_Q: gl.constexpr, HEADS: gl.constexpr, CAUSAL: gl.constexpr, R: gl.constexpr,
        NS: gl.constexpr, stamp_ptr=None, TIMELINE: gl.constexpr = False,
    ):
        """Program (request b, chunk p) of a dense fp8 decode of R = 8 or 16 query rows, as
        `decode_sm90_mma8._mla_decode_mma8_kernel`'s 8-row and wide forms, by two warp groups
        (module docstring); arguments as that kernel's, but always split partials:
        ``num_splits`` = 2 × the grid's chunks. TIMELINE: each group stamps its split's row of
        int64 ``stamp_ptr`` [batch × num_splits, 12] as that kernel's programs do (entry: the
        program's)."""
        gl.static_assert(NS % 2 == 1, "NS: an odd ring (the groups alternate per stage)")
        gl.static_assert(R == NR or R == 16, "R: 8 or 16 query rows a program")
        b = gl.program_id(0)
        psplit = gl.program_id(1)
        if TIMELINE:  # both groups' rows: the program's entry
            _stamp(stamp_ptr + (b * num_splits + 2 * psplit).to(gl.int64) * 12, 0)
            _stamp(stamp_ptr + (b * num_splits + 2 * psplit + 1).to(gl.int64) * 12, 0)
        lat_buf = gl.allocate_shared_memory(gl.uint8, [NS, 4, BN, 128], lat_desc.layout)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [NS, BN, 64], rope_desc.layout)
        if R == NR:  # q staged once for the groups' registers (`_group`), in a stage's bytes
            p_s = gl.allocate_shared_memory(gl.float16, [4, BN, R], P_SHARED)
            q_lat = gl.allocate_shared_memory(gl.uint8, [4, BN, 128], lat_desc.layout)
            q_rope = q_lat
        else:
            p_s = gl.allocate_shared_memory(gl.float16, [4, BN, R], P_SHARED_WIDE)
            q_lat = gl.allocate_shared_memory(gl.float16, [R, 512], Q_WIDE_STORE_LAT)
            q_rope = gl.allocate_shared_memory(gl.float16, [R, 64], Q_WIDE_STORE_ROPE)
        bars = gl.allocate_shared_memory(gl.int64, [2 * NS, 1], mbarrier.MBarrierLayout())
        for k in gl.static_range(2 * NS):
            mbarrier.init(bars.index(k), count=1)
        fence_async_shared()
        seqlen = gl.minimum(gl.load(seqlens_ptr + b), max_len)
        start, end, n_tiles = _split_range(seqlen, psplit, num_splits // 2, BN)
        bt_row = bt_ptr + b.to(gl.int64) * stride_bt
        for st in gl.static_range(NS):  # every stage's first tile
            _copy(lat_desc, rope_desc, lat_buf, rope_buf, bars, st,
                  _tile_row(bt_row, start + st * BN, end, page_shift), st < n_tiles, NS)
        kv_mult = gl.load(scale_ptr)
        qk_scale = softmax_scale * kv_mult * LOG2E
        _stage_q(q_lat, q_rope, q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, S_Q,
                 HEADS, R)
        _cta_barrier()
        args = (lat_desc, rope_desc, lat_buf, rope_buf, bars, p_s, q_lat, q_rope, bt_row,
                seqlen, start, end, n_tiles, page_shift, qk_scale, kv_mult, b, psplit,
                out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
                stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh, lse_empty,
                num_heads, num_splits)
        if TIMELINE:
            stamps = stamp_ptr
        else:  # (a partition takes no None: any pointer, unused)
            stamps = part_max_ptr
        gl.warp_specialize([(_group0, (args, stamps, S_Q, HEADS, CAUSAL, R, NS, TIMELINE)),
                            (_group1, (args, stamps, S_Q, HEADS, CAUSAL, R, NS, TIMELINE))],
                           [WG_WARPS], [WG_REGS])
