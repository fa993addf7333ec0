"""SM90 lightning-indexer logits for fp8 q, in Gluon (the math: `fp8mla.kernels.indexer`):

    logit[r, s] = Σ_j w[r, j] · ReLU(q[r, j] · k[s]) · k_scale[s]   for lo[r] <= s < hi[r].

Each 64-key tile's e4m3 bytes, as the TMA writes them into a ring of ``NS`` stages, are the A
operand of one FP8 wgmma chain (K = 128: four k32 steps) against q's e4m3 rows, staged once
per program as the B operand — nothing is converted, keys or q. The Triton kernel converts
both to fp16 lanes (four K = 32 products a tile) and leaves q's shared-memory staging to the
compiler, which triton 3.8 and 3.9 place inside the tile loop (`BENCHMARKS.md`, session 42:
3.9 at 64 index heads 91.5 → 138.1 µs); here q's staging is the kernel's own.

Precision: the wgmma keeps its FP8 sums to ~14 bits (DeepSeek-V3's report, of the H800);
a chain is 128 products, the interval after which DeepSeek-V3's training and DeepGEMM's FP8
GEMMs promote such sums to float32. Against the Triton kernel's exact fp16 products
(H100, B=64 × 32K, `benchmarks/indexer_variants.py`) a relative error of at most 2.7e-4 at
64 heads (4.1e-2 absolute: logits in the hundreds) and 5.6e-4 at 32; at 7 heads (the GPU
tests) 6e-3 (0.016 on a logit of 2.7), past the tests' 1e-3 — the heads' ReLU-weighted sum
averages the errors, so the launcher serves this kernel from `fp8mla.indexer.SM90_MIN_HEADS`
heads. Chains split into fresh accumulators (``KSPLIT``) cut the error only ~3× at four (each
k32 wgmma alone: the rounding is inside the instruction) and cost 64 heads 113 → 122 µs (3.6)
and → 133 (3.9): one chain it is.

Scores land as [64 keys, heads], so the ReLU-weighted sum over heads stays within each quad
of lanes; the keys' float32 scales are loaded a tile ahead in the same row layout.

Per program: one query row and ``span`` key positions, as `_indexer_logits_kernel` (tiles
outside the row's window are written −inf without a copy). Keys:
- PAGED: DeepGEMM's ``fp8_paged_mqa_logits`` pages (page_size · 128 key bytes, then page_size
  float32 scales), pages of ≥ 64 keys, seen as rows of 128 bytes: page p's key o is row
  p · page_rows + o (page_rows = page_size · 132 / 128); row r // S_Q's block table maps
  positions.
- contiguous (``fp8_mqa_logits``): key bytes [S, 128], scales [S]; the copies past S are the
  TMA's zeros.

Gluon does not run in Triton's interpreter; where this Triton has no (such) Gluon
`fp8mla.kernels.decode_sm90.AVAILABLE` is False and the launcher keeps the Triton kernel.
"""

from fp8mla.kernels.decode_sm90 import AVAILABLE

BLOCK_S = 64  # keys per tile
NUM_WARPS = 4  # one warpgroup: each wgmma's 64 rows
# ring stages: two tiles in flight while one is scored. 3 against 4, H100, B=64 × 32K, µs
# graph-timed (h100-20261207-s45-ea793ab-triton3{6,9}-indexer-variants.json): 64 heads 111.5 /
# 111.9 against 113.3 / 113.6 (3.6 / 3.9), 32 heads 109.7 against 111.1 / 112.2, B=8 × 16K
# × 4 heads 14.6 against 15.1; session 44 (four chains) 116.9 / 120.1 against 121.8 / 133.4
NS = 3
KSPLIT = 1  # wgmma chains a tile, each into a fresh float32 accumulator, summed in registers:
# 1 = one chain of 128 products; 4 = every k32 wgmma alone (the module docstring: precision)


def descriptor(keys):
    """The TMA descriptor over key rows, float8_e4m3fn [rows, 128]: [64, 128]-byte boxes under
    the 128-byte swizzle (the wgmma's A operand as copied)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from fp8mla.kernels.decode_sm90 import gl

    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    return TensorDescriptor.from_tensor(keys, [BLOCK_S, 128], layout)


if AVAILABLE:
    import triton.language as tl

    from fp8mla.kernels.decode_sm90 import (
        _cta_barrier,
        _tma_load,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    BS = gl.constexpr(BLOCK_S)
    KEEP_NAN = gl.constexpr(tl.PropagateNan.ALL)  # the ReLU keeps NaN (`kernels.indexer._relu`)
    # q's rows as loaded: 16 bytes a thread, 8 lanes along one 128-byte row
    Q_LOAD = gl.constexpr(gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0]))

    @gluon.jit
    def _tile_page(bt_row, s0, t_hi, page_shift):
        """The page holding key position ``s0`` (0 from ``t_hi`` on: a copy not issued)."""
        return gl.load(bt_row + (s0 >> page_shift), mask=s0 < t_hi, other=0)

    @gluon.jit
    def _tile_row0(bt_row, s0, t_hi, page_shift, page_rows, PAGED: gl.constexpr):
        """The 128-byte row of key ``s0`` (the first of its tile) in the descriptor's view."""
        if PAGED:
            return (_tile_page(bt_row, s0, t_hi, page_shift) * page_rows
                    + (s0 & ((1 << page_shift) - 1)))
        else:
            return s0

    @gluon.jit
    def _tile_scales(k_f32_ptr, k_scale_ptr, bt_row, s0, t_hi, page_shift, num_pages,
                     PAGED: gl.constexpr, LAYOUT: gl.constexpr):
        """float32 scales of keys s0 … s0 + 63 in ``LAYOUT`` (zeros from t_hi on), and whether
        the tile's page lies in the pool (pages of ≥ 64 keys: one page a tile). A page outside
        it — an entry only the validating path rejects — has no scale read, and its keys score
        −inf as the Triton kernel's; the keys' TMA copy is bounded by the pool's descriptor."""
        pos = s0 + gl.arange(0, BS, layout=LAYOUT)
        if PAGED:  # in the page's tail, after its page_size rows of 32 key words
            page = _tile_page(bt_row, s0, t_hi, page_shift).to(gl.int64)
            ok = (page >= 0) & (page < num_pages)
            at = (page << page_shift) * 33 + (32 << page_shift) + (pos & ((1 << page_shift) - 1))
            return gl.load(k_f32_ptr + at, mask=(pos < t_hi) & ok, other=0.0), ok
        else:
            return gl.load(k_scale_ptr + pos, mask=pos < t_hi, other=0.0), True

    @gluon.jit
    def _issue(keys_desc, k_s, bars, stage, row0, pred):
        """Copy the 64 key rows from descriptor row ``row0`` into ring stage ``stage``."""
        bar = bars.index(stage)
        mbarrier.expect(bar, BS * 128, pred=pred)
        _tma_load(keys_desc, [row0, 0], bar, k_s.index(stage), pred=pred)

    @gluon.jit
    def _scores(k_tile, q_s, zero, KSPLIT: gl.constexpr):
        """q · k of a tile's 64 keys, [64 keys, H] float32: KSPLIT wgmma chains, each over
        128 / KSPLIT dims into a fresh accumulator, summed in float32 registers."""
        KC: gl.constexpr = 128 // KSPLIT
        s = zero
        for c in gl.static_range(KSPLIT):
            part = warpgroup_mma(k_tile.slice(c * KC, KC, dim=1),
                                 q_s.slice(c * KC, KC, dim=1).permute((1, 0)), zero,
                                 use_acc=False, is_async=True)
            part = warpgroup_mma_wait(0, deps=[part])
            if c == 0:
                s = part
            else:
                s = s + part
        return s

    @gluon.jit
    def _indexer_sm90_kernel(
        q_ptr, w_ptr, keys_desc, k_f32_ptr, k_scale_ptr, block_table_ptr, lo_ptr, hi_ptr,
        out_ptr, stride_qr, stride_wr, stride_bt, stride_or, num_heads, max_len, page_shift,
        page_rows, span, num_pages,
        S_Q: gl.constexpr, H: gl.constexpr, PAGED: gl.constexpr, NS: gl.constexpr,
        KSPLIT: gl.constexpr, ROW_LENS: gl.constexpr,
    ):
        """q_ptr: uint8 [rows, num_heads · 128] (e4m3 bytes, row stride ``stride_qr``);
        w_ptr: float32 [rows, num_heads]; out_ptr: float32 [rows, max_len]. Grid: (rows,
        programs a row), each ``span`` positions (a multiple of 64). H: heads padded to a power
        of two ≥ 16 (the wgmma's N). ROW_LENS: paged, hi_ptr holds each row's own context
        length (else each request's, its S_Q queries causal among them)."""
        gl.static_assert(NS >= 2, "NS: a ring of at least two stages")
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, H, 32])
        KEYS: gl.constexpr = gl.SliceLayout(1, ACC)
        r = gl.program_id(0)
        base = gl.program_id(1) * span
        if PAGED:  # row r is query r % S_Q of request r // S_Q
            lo = 0
            if ROW_LENS:  # hi_ptr: each query row's own context length
                hi = gl.maximum(gl.load(hi_ptr + r), 0)
            else:  # hi_ptr: the requests' context lengths, the queries causal among them
                hi = gl.maximum(gl.load(hi_ptr + r // S_Q) - S_Q + 1 + r % S_Q, 0)
        else:
            lo = gl.load(lo_ptr + r)
            hi = gl.load(hi_ptr + r)
        out_row = out_ptr + r.to(gl.int64) * stride_or
        offs = gl.arange(0, BS, layout=KEYS)
        # the span's tiles that meet the window: [t_lo, t_hi); the others are −inf throughout
        t_lo = gl.maximum(base, lo - lo % BS)
        t_hi = gl.minimum(gl.minimum(base + span, hi), max_len)  # never past the output
        n_tiles = gl.maximum(t_hi - t_lo + BS - 1, 0) // BS
        for s0 in range(base, base + span, BS):
            if (s0 < t_lo) | (s0 >= t_hi):
                gl.store(out_row + s0 + offs, gl.full([BS], float("-inf"), gl.float32,
                                                      layout=KEYS), mask=s0 + offs < max_len)

        k_s = gl.allocate_shared_memory(gl.float8e4nv, [NS, BS, 128], keys_desc.layout)
        q_s = gl.allocate_shared_memory(gl.float8e4nv, [H, 128], keys_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        if n_tiles > 0:
            for st in gl.static_range(NS):
                mbarrier.init(bars.index(st), count=1)
            fence_async_shared()  # the initialised barriers, before the async proxy
            bt_row = block_table_ptr + (r // S_Q).to(gl.int64) * stride_bt
            for st in gl.static_range(NS - 1):  # the ring's first tiles in flight before q
                _issue(keys_desc, k_s, bars, st,
                       _tile_row0(bt_row, t_lo + st * BS, t_hi, page_shift, page_rows,
                                  PAGED), st < n_tiles)

            qh = gl.arange(0, H, layout=gl.SliceLayout(1, Q_LOAD))
            qc = gl.arange(0, 128, layout=gl.SliceLayout(0, Q_LOAD))
            q = gl.load(q_ptr + r.to(gl.int64) * stride_qr + qh[:, None] * 128 + qc[None, :],
                        mask=(qh < num_heads)[:, None], other=0)
            q_s.store(q.to(gl.float8e4nv, bitcast=True))  # heads past num_heads: zeros
            hw = gl.arange(0, H, layout=gl.SliceLayout(0, ACC))
            w = gl.load(w_ptr + r.to(gl.int64) * stride_wr + hw, mask=hw < num_heads, other=0.0)
            k_scale, k_ok = _tile_scales(k_f32_ptr, k_scale_ptr, bt_row, t_lo, t_hi,
                                         page_shift, num_pages, PAGED, KEYS)
            row_next = _tile_row0(bt_row, t_lo + (NS - 1) * BS, t_hi, page_shift,
                                  page_rows, PAGED)
            fence_async_shared()  # q's rows, before the wgmma reads them
            zero = warpgroup_mma_init(gl.zeros([BS, H], gl.float32, layout=ACC))
            for i in range(n_tiles):
                s0 = t_lo + i * BS
                stage = i % NS
                # every warp is past tile i − 1 (its wgmma waited for): its stage takes tile
                # i + NS − 1, whose row was looked up a tile ago (and q is whole at i = 0)
                _cta_barrier()
                nxt = i + NS - 1
                _issue(keys_desc, k_s, bars, nxt % NS, row_next, nxt < n_tiles)
                row_next = _tile_row0(bt_row, s0 + NS * BS, t_hi, page_shift, page_rows,
                                      PAGED)
                scale_next, ok_next = _tile_scales(k_f32_ptr, k_scale_ptr, bt_row, s0 + BS,
                                                   t_hi, page_shift, num_pages, PAGED, KEYS)
                mbarrier.wait(bars.index(stage), (i // NS) & 1)
                s = _scores(k_s.index(stage), q_s, zero, KSPLIT)
                relu = gl.maximum(s, 0.0, propagate_nan=KEEP_NAN)
                logit = gl.sum(relu * w[None, :], axis=1) * k_scale
                pos = s0 + offs
                gl.store(out_row + pos, gl.where((pos >= lo) & (pos < t_hi) & k_ok, logit,
                                                 float("-inf")), mask=pos < max_len)
                k_scale, k_ok = scale_next, ok_next
            for st in gl.static_range(NS):
                mbarrier.invalidate(bars.index(st))
