"""SM90 dense decode for programs of at most 8 query rows (s_q × heads: GLM-5 at TP8 is 8
heads), in Gluon, on mma.sync with the operands swapped and q held in registers; and its wide
form for 9–16 rows, q read from shared memory (below).

Why: the Triton kernel's 16-row program pads 8 heads to 16 MMA rows and reloads q, its A
operand, from shared memory every tile. Here a tile's tokens are the MMA's M and the ≤ 8 query
rows its N (m16n8k16, fp16 operands, fp32 accumulators; 4 warps, 16 tokens each):

    Sᵀ [64 tokens, 8 rows]  = K [64, 576] · qᵀ        (A: the tile's e4m3 words, converted)
    Oᵀ [512 dims, 8 rows]  += Vᵀ [512, 64] · Pᵀ       (A: the same words, transposed)

No MMA row is padding and qᵀ, the first product's B operand, stays in registers for the whole
program (72 registers a thread). Both A operands are loaded as 32-bit words of four e4m3 bytes
straight from the TMA ring and converted in registers (`fp8.E4M3X4_TO_F16_ASM`: a pair of words
along the MMA's K — two dims' words of one token, or one word of two tokens — becomes four f16x2
registers, one per byte "lane" j): lane j of word w is dim 4w + j, so the first product runs
per lane against qᵀ's dims 4w + j, and the second accumulates four Oᵀ lanes of 128 words.
Each value is converted twice (once per product's operand layout), as in the Triton kernel.

The ring holds NS tiles of 64 tokens (`STAGES` = 3 in the 8-row form, below; four [64,
128]-byte latent boxes and a [64, 64] rope box each, by TMA: pages of ≥ 64 tokens), read as
int32 through shared linear layouts that undo the boxes' swizzle; the copy of tile i + NS − 1
is issued once every warp is past tile i − 1 (after tile i's P barrier; a 2-stage ring at the
top of tile i, below).
The column softmax (over tokens, across the warps) keeps an exact running max and its sums per
thread, reduced once at the end. P crosses the warps through shared memory (double-buffered: one
explicit CTA barrier a tile in a deeper ring). Rows past a request's end: −inf scores and, in
the partial last tile, zeroed words in the second product (a page's tail may hold NaN).

Measured on the H200 (triton 3.6; h200-20261201-s19-dc1cb31-*; ceiling 4.49 TB/s): B=64 × 8K
× 8 heads 93.3 µs, 3.25 TB/s (the Triton kernel: 112.3), B=1 × 128K 39.6 µs (kernel and
combine), B=128 × 4K 93.6, s_q 2 × 4 heads 93.7, B=8 × 32K 59.0. Nsight Compute at B=64: DRAM
78% of peak, 8 warps an SM (two programs; 195–201 registers), the ALU pipe (conversions) 46%
busy, tensor and shared 20%; stalls per issue led by the long scoreboard (1.23: TMA waits) and
fixed-latency waits (0.91) — latency-bound with too few warps, not bound by any pipe.

Two programs per SM at 3 stages, not one at 4 (148 KB). In one wave of two programs an SM the
program the block scheduler placed second leaves ~2.5 µs after its SM's first (B=1 × 128K,
`benchmarks/timeline.py`, h200-20261202-s23-7900be9-timeline.json), and one program per SM has no
such tail: under do_bench's flush (the L2 left dirty) it measured faster or level (B=1 × 128K
38.1 / 37.8 µs against 38.8 / 39.2, B=128 × 4K 92.0 against 94.4, B=8 × 32K 57.5 against
59.1; s23-7b97f72-decode-variants.json), but with a clean L2, as a serving step starts, slower
everywhere (`benchmarks/flush_ab.py`, s23-224ae48-flush-ab.json: B=64 × 8K 88.1 / 88.7 against
85.9 / 85.8, B=1 × 128K 33.7 / 33.7 against 32.6 / 32.8, B=8 × 32K 52.4 / 52.3 against 50.6 /
50.8, B=128 × 4K 86.5 / 86.6 against 86.2 / 86.1).

The wide form (``R`` = 16: 16 heads, s_q 2 × 8) runs the same tile with two MMA column blocks.
qᵀ for 16 rows would take 144 registers, so it stays in shared memory, staged once
(`WIDE_LAT`, `WIDE_ROPE`: conflict-free 4-byte loads) and read every tile — shared traffic the
8-row form does not have, but no value converted more often than there. Its ring has two stages
(two programs per SM: 96.5 KB of shared memory, 200–216 registers, no spills) and issues the
copy of tile i + 1 at the top of tile i, after a CTA barrier, so that the copy has a whole tile
to land (issued after P's barrier it had half: 107.3 → 105.0 µs at B=64 × 8K × 16; the 8-row
form's 3-stage ring lost 2% the same way, so keeps its copies after P's barrier). H200 (triton
3.6; h200-20261202-s21-9271bf1-decode-variants.json): B=64 × 8K × 16 heads 105.0 / 105.7 µs
against the Triton kernel's 114.8 / 115.1, s_q 2 × 8 106.0 against 115.7. Nsight Compute at
B=64 (s21-9e84ea7): DRAM 64% of peak, ALU 38% and tensor 33% busy, stalls per issue led by
fixed-latency waits (0.93) and the long scoreboard (0.75) — latency-bound at 8 warps an SM.
Programs of few tiles lose to the Triton kernel (q's staging and the ring's fill per program):
the launcher takes the wide form for programs of ≥ 16 tiles (`fp8mla.decode`; 12 tiles: 55.3
against 53.4 µs, B=24 × 8K, s22-0fa10af; on triton 3.8, whose Triton kernel is slower, at any
length: `fp8mla.decode.mma16_min_tiles`). The fp8_ds_mla wide form has no such rule: its
Triton kernel is further behind (`decode_sm90_mma8_ds`).

Head blocks (`fp8mla.decode.SM90_MMA16_FP8_HEAD_BLOCKS`, as `decode_sm90_mma8_ds`'s): fp8
plans of 17–32 query rows (MTP s_q 2 × 16 heads, s_q 4 × 8, 32 heads) run the wide form over
``HEADS`` = 16 // s_q heads a program, the grid's third axis picking the block, each program
addressing q, its outputs and partials from its first head; each block reads the request's pages
again (from L2 mostly: a request's blocks run side by side). H100 (h100-20261207-s45-*): on
triton 3.8, whose Triton kernel stages its converted operands through shared memory, B=64 × 8K ×
s_q 2 × 16 heads 177.4 µs against that kernel's 296.4; on 3.6 / 3.9 level to 7% slower at B=64
(2 splits a request) but 5–12% faster from 4 splits (B=32 × 8K 92.1 against 97.5 on 3.6; B=1 ×
128K × 32 heads 54.8 against 60.8) — the launcher's rule.

The wide form's first product as FP8 wgmma (``QK8``, off by default since session 25 for its
precision — `DecodePlan(fp8_scores=True)` or `fp8mla.decode.SM90_MMA16_QK8`, programs of
≥ 32 tiles): a ring stage's bytes, as the TMA boxes wrote them (128-byte swizzle), are the
wgmma's A operand [64 tokens, 128 dims] per chunk, and q the B operand, split once per program
into two e4m3 halves (`_q8_stage`: each row times a power of two, hi = e4m3(x), lo =
e4m3(16 (x − hi)); bf16 holds 8 significant bits, each half 4, so hi + lo / 16 is exact inside
e4m3's exponent range). Each chunk's half gets a fresh accumulator (the wgmma keeps FP8 sums to
~14 bits; chains of ≤ 128 dims added in float32, as DeepSeek-V3 promotes them), all ten issued
before one wait (`_scores_fp8`); the accumulators' layout is the MMA layout's for these shapes,
so nothing moves. No conversion, register load or mma.sync remains in that product: 1,006
instructions a tile against 1,211 (offline sm_90, 241 registers, no spills). H200: −0.5 /
−0.7 µs at B=64 × 8K × 16 under do_bench's flush, −0.7 / −1.1 with a clean L2
(h200-20261202-s24-qk8b-flush-ab.json) — the per-program timeline
hardly moved (a program alone on its SM still takes ~1.6 µs a tile: latency, not issue, bounds
it; s24-53a3ceb-timeline.json) — and +1 µs on programs of 16 tiles, where q's split is paid per
program. The 8-row form keeps mma.sync: its qᵀ lives in registers already, and q's halves would
need 9 KB more shared memory than a 3-stage ring leaves for two programs per SM.

Both forms skip the scores' mask on tiles every row sees whole and the accumulators' rescale on
tiles where no row's max grew (±0.3 µs).

Tried and removed in session 27 (H200, flush A/B; source at the commits): (1) the softmax
without the max across warps — each warp's P against its own reference, the references
reconciled after P's barrier and P's token blocks rescaled in the second product where a row's
max grew (0eef3d2; 2 of the tile's 7 barriers gone, here and in the fp8_ds_mla and sparse
kernels): B=64 × 8K × 16 heads 105.2 / 102.4 µs against 103.4 / 99.6, fp8_ds_mla × 16 136.6
against 124.7, the 8-row cases level; (2) a lazy reference, moved only once a row's max passed
it by 2^8, so the rescale (taken on most tiles of 16-row programs) runs on few (346f864):
level within 0.3 µs. Neither the max's barriers nor the rescale bound the tile.

Outputs match `_mla_decode_kernel`'s: the final rows (one split) or the split's partials for
`_combine_splits_kernel`. Query row r is (s_q index r // HEADS, head r % HEADS); causal among
the s_q queries.
"""

from fp8mla.kernels import decode_sm90
from fp8mla.kernels.decode_sm90 import AVAILABLE
from fp8mla.kernels.fp8 import E4M3X4_TO_F16_ASM, E4M3X4_TO_F16_CONSTRAINTS

if AVAILABLE:
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from fp8mla.kernels.decode_sm90 import (
        LOG2E,
        REINTERPRET_NEW,
        _cta_barrier,
        _launch_dependents,
        _split_range,
        _stamp,
        _tile_row,
        _tma_load,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

ROWS = 8  # query rows per program: the MMA's N (qᵀ in registers)
BLOCK_N = 64  # tokens per tile (one TMA box per 128 latent bytes; pages of ≥ 64 tokens)
STAGES = 3  # the 8-row form's ring depth: 3 × 36 KB, two programs per SM (module docstring)
NUM_WARPS = 4
# the wide form: 16 query rows (two MMA column blocks), qᵀ read from shared memory every tile
WIDE_ROWS = 16
SMEM_PER_SM = 227 * 1024


def rows_for(rows: int) -> int:
    """The program's row count (the kernels' ``R``) serving ``rows`` = s_q × heads query rows:
    `ROWS` up to 8, `WIDE_ROWS` up to 16."""
    if not 1 <= rows <= WIDE_ROWS:
        raise ValueError(f"rows: expected 1–{WIDE_ROWS} query rows a program, got {rows}")
    return ROWS if rows <= ROWS else WIDE_ROWS


def programs_per_sm(rows: int, stages: int) -> int:
    """Programs of ``rows`` (`rows_for`) and a ring of ``stages`` one SM holds at once: the
    ring (36 KB a stage), P and, in the wide form, q (18 KB) in shared memory; the registers
    (≤ 255 a thread, 4 warps) allow two."""
    per_program = stages * 36 * 1024 + (4 if rows == ROWS else 25) * 1024
    return max(1, min(2, SMEM_PER_SM // per_program))


def descriptors(flat):
    """TMA descriptors over fp8-format rows, uint8 [num_slots, 576]: the latent as one
    [4, 64, 128]-byte box a tile (the pool seen as [4 chunks, rows, 128 bytes]: chunk-major in
    shared memory, so the 128-byte swizzle's phase is the token's; four 2-D boxes into one
    buffer cost a CTA barrier between copies), and the rope's [64, 64]-byte box."""
    lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3)
    lat = TensorDescriptor(flat, [4, flat.shape[0], 128], [128, flat.stride(0), 1],
                           [4, BLOCK_N, 128], lay)
    return lat, decode_sm90.descriptors(flat)[1]


# Product 1's K order. Its A operand's 8-byte loads (a thread: words k, k + 1 of token g, k =
# 2 · (lane % 4) + 8 · (register pair)) read words 0–7 — two 16-byte units — for tokens
# 0–3 in one 16-lane phase; tokens g and g ^ 1 hold those units at the same banks under the
# 128-byte swizzle, a 2-way conflict on every load (Nsight Compute: 290 extra wavefronts a tile,
# h200-20261201-s18-2bde5d1-ncu-mma8-fp8-B64-H8.txt). The sum runs over K in any order, so K
# index k reads stored word phys(k): bit i of the stored word's index is bit log2(K_BITS[i]) of
# k. Words 0 and 1 of every unit stay a pair; the lanes' words of one load fall in units u and
# u + 4 (the rope's: u and u + 2), which the swizzle sends to 8 distinct units across tokens 0–3.
# qᵀ's lanes are read in the same order (`_q_lanes_bases`). On the H200 (s19-dc1cb31-*) the
# permutation took shared-load wavefronts from 7.24 M to 4.95 M but B=64 × 8K × 8 heads only
# from 93.7 to 93.3 µs (ABAB): the time moved to waiting on memory (long-scoreboard stalls 0.98
# → 1.23 per issue). STORED_BITS: the stored order (tests/test_bank_model.py's "before").
LAT_K_BITS = [1, 2, 8, 16, 4, 32, 64]
ROPE_K_BITS = [1, 2, 8, 4, 16, 32]
STORED_BITS = [1, 2, 4, 8, 16, 32, 64]


def _k_words_bases(k):
    """A ring stage's latent, [4 chunks, 64 tokens, 128 bytes] under the TMA boxes' 128-byte
    swizzle (16-byte unit u of token t's 128 bytes at u ^ (t % 8)), as int32 words: offset bits
    0–1 pick the word in a unit, 2–4 the stored unit, 5–10 the token, 11–12 the 128-byte chunk
    → [token, K index] (stored word 32 · chunk + 4 · unit + word, in K order ``k``)."""
    return ([[0, k[i]] for i in range(5)] + [[1, k[2]], [2, k[3]], [4, k[4]]]
            + [[8, 0], [16, 0], [32, 0], [0, k[5]], [0, k[6]]])


def _r_words_bases(k):
    """The rope box, [64 tokens, 64 bytes] under the 64-byte swizzle (unit u of token t at
    u ^ ((t >> 1) % 4)), as int32 [token, K index] in K order ``k``."""
    return ([[0, k[i]] for i in range(4)] + [[1, 0], [2, k[2]], [4, k[3]]]
            + [[8, 0], [16, 0], [32, 0]])


# the latent as [word, token] for the second product (its dims in stored order)
V_WORDS_BASES = [[1, 0], [2, 0], [4, 0], [8, 0], [16, 0], [4, 1], [8, 2], [16, 4], [0, 8],
                 [0, 16], [0, 32], [32, 0], [64, 0]]


def _q_store_bases(word_bits):
    """Offset bits → [slot · 8 + row, dim] of q staged as [lane j, row r, word w ^ 8r]
    (2**word_bits words a lane) in slots that fill a 32 KB ring stage: the word's bits, the
    row's (with the XOR), the lane's, the slot's."""
    words = [[0, 4 << i] for i in range(word_bits)]
    slots = [[8 << i, 0] for i in range(14 - word_bits - 5)]
    return words + [[1, 32], [2, 64], [4, 128], [0, 1], [0, 2]] + slots


def _q_lanes_bases(word_bits, k):
    """The same offsets → [(slot · 4 + lane) · 2**word_bits + K index, row], K order ``k``."""
    n = 1 << word_bits
    words = [[k[i], 0] for i in range(word_bits)]
    slots = [[(4 * n) << i, 0] for i in range(14 - word_bits - 5)]
    return words + [[k[3], 1], [k[4], 2], [k[5], 4], [n, 0], [2 * n, 0]] + slots


def _stored_word(k_index, k):
    """The stored word at K index ``k_index`` under K order ``k`` (bit b of the K index is
    stored bit i where k[i] = 2**b)."""
    return sum(1 << k.index(1 << b) for b in range(len(k)) if k_index >> b & 1)


# The wide form's q, staged once as fp16 [lane j, row r (4 bits), 2**word_bits stored words
# w ^ X(r)] and read every tile as qᵀ's B operands (two 8-row column blocks), one 4-byte load
# per register pair (K indices κ, κ + 1 of one lane and row). In one load the lanes' K bits 1–2
# pick stored bits (1, 4) of the latent (`LAT_K_BITS`), (1, 3) of the rope, and X(r) puts the 8
# rows of a column block on the remaining bank bits: the latent's 256-byte rows start at bank 0
# (row bits 0–2 → stored bits 2, 3, 5), the rope's 32-byte rows at bank 8r (row bit 2 → stored
# bit 2) — conflict-free (tests/test_bank_model.py). Reading qᵀ by ldmatrix instead (the words
# in K order: 36 x4 loads a tile instead of 144) measured within 0.5 µs either way on the H200
# (h200-20261202-s21-1e438e4-decode-variants.json). (word order: the K bit each offset bit
# holds; row XOR in offset bits)
WIDE_LAT = (LAT_K_BITS, [4, 8, 32, 0])
WIDE_ROPE = (ROPE_K_BITS[:4], [0, 0, 4, 0])


def _k_of_offset(x, order):
    """The K index of word offset bits ``x`` whose bit i holds K bit value order[i]."""
    return sum(order[i] for i in range(len(order)) if x >> i & 1)


def _q_wide_store_bases(order, row_xor, k):
    """Offset bits → [row, dim] of the wide q's store view ([16, 4 · 2**len(order)]; dim 4w + j
    for stored word w, lane j): offset bit i holds K bit value order[i] of K order ``k``, row
    bit c XORs the word offset with row_xor[c]."""
    return ([[0, 4 * _stored_word(o, k)] for o in order]
            + [[1 << c, 4 * _stored_word(_k_of_offset(x, order), k)]
               for c, x in enumerate(row_xor)] + [[0, 1], [0, 2]])


def _q_wide_lanes_bases(order, row_xor):
    """The same offsets → [lane · 2**len(order) + K index, row]."""
    n = 1 << len(order)
    return ([[o, 0] for o in order]
            + [[_k_of_offset(x, order), 1 << c] for c, x in enumerate(row_xor)]
            + [[n, 0], [2 * n, 0]])


if AVAILABLE:
    NR = gl.constexpr(ROWS)
    BN = gl.constexpr(BLOCK_N)
    MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                 instr_shape=[16, 8]))
    KA = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
    QB = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
    K_WORDS = gl.constexpr(gl.SharedLinearLayout(offset_bases=_k_words_bases(LAT_K_BITS)))
    R_WORDS = gl.constexpr(gl.SharedLinearLayout(offset_bases=_r_words_bases(ROPE_K_BITS)))
    V_WORDS = gl.constexpr(gl.SharedLinearLayout(offset_bases=V_WORDS_BASES))
    P_SHARED = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    # q [8 rows, 4 · W dims] (dim d = 4w + j) staged once in a free ring stage as fp16
    # [lane j, row r, word w ^ 8r]: each of qᵀ's B-operand register pairs (words w, w + 1 of one
    # lane and row) is one 4-byte load, the 8 rows' 16-byte runs in distinct banks.
    # Q_STORE_*: the [8, 4 · W] view q is stored through; Q_LANES_*: the [4, W, 8] view qᵀ's
    # lanes are loaded from (W = 128 latent words; the rope's 16 in a 64-word stage)
    Q_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))
    Q_STORE_LAT = gl.constexpr(gl.SharedLinearLayout(offset_bases=_q_store_bases(7)))
    Q_LANES_LAT = gl.constexpr(gl.SharedLinearLayout(offset_bases=_q_lanes_bases(7, LAT_K_BITS)))
    Q_STORE_ROPE = gl.constexpr(gl.SharedLinearLayout(offset_bases=_q_store_bases(6)))
    Q_LANES_ROPE = gl.constexpr(gl.SharedLinearLayout(
        offset_bases=_q_lanes_bases(6, ROPE_K_BITS)))
    Q_WIDE_STORE_LAT = gl.constexpr(gl.SharedLinearLayout(
        offset_bases=_q_wide_store_bases(*WIDE_LAT, LAT_K_BITS)))
    Q_WIDE_LANES_LAT = gl.constexpr(gl.SharedLinearLayout(
        offset_bases=_q_wide_lanes_bases(*WIDE_LAT)))
    Q_WIDE_STORE_ROPE = gl.constexpr(gl.SharedLinearLayout(
        offset_bases=_q_wide_store_bases(*WIDE_ROPE, ROPE_K_BITS[:4])))
    Q_WIDE_LANES_ROPE = gl.constexpr(gl.SharedLinearLayout(
        offset_bases=_q_wide_lanes_bases(*WIDE_ROPE)))
    # P [64 tokens, 16 rows] fp16: rows of 32 bytes, the 16-byte units of each 4-row group
    # swapped every other group (the second product's transposed 8 × 8 reads)
    P_SHARED_WIDE = gl.constexpr(gl.SwizzledSharedLayout(8, 4, 2, [1, 0]))
    # output rows [R, 512] as `_store_in_order` stores them: 8 consecutive dims a thread, a
    # warp's 32 threads along one row's 256 dims
    OUT_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0]))
    # the first product as FP8 wgmma (`QK8`): a ring stage's latent as [4 · 64, 128] e4m3
    # (the TMA boxes' 128-byte swizzle), its rope [64, 64] (64-byte), q's e4m3 halves the same
    Q8_LAT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                               rank=2))
    Q8_ROPE = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8,
                                                rank=2))

    @gluon.jit
    def _f16_lanes(words):
        """Four fp16 tensors (lane j: byte j of each word) of e4m3 words in an MMA operand
        layout whose register pairs run along K."""
        return gl.inline_asm_elementwise(E4M3X4_TO_F16_ASM, E4M3X4_TO_F16_CONSTRAINTS, [words],
                                         dtype=(gl.float16, gl.float16, gl.float16, gl.float16),
                                         is_pure=True, pack=2)

    @gluon.jit
    def _view(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        """A ring buffer's bytes viewed as ``dtype`` ``shape`` in ``layout``."""
        if REINTERPRET_NEW:
            return buf.reinterpret(dtype, shape, layout)
        else:
            return buf._reinterpret(dtype, shape, layout)

    @gluon.jit
    def _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, stage, row0, pred,
               ROPE_COL: gl.constexpr):
        """Copy the tile at pool row ``row0`` into ring stage ``stage`` (when ``pred``): one
        [4, 64, 128]-byte latent box (`descriptors`) and one rope box from byte ``ROPE_COL`` of
        each row ([64, 64] bytes of fp8 rows at 512; [64, 128] of fp8_ds_mla's bf16 at 528)."""
        bar = bars.index(stage)
        mbarrier.expect(bar, BN * (512 + rope_buf.shape[2]), pred=pred)
        _tma_load(lat_desc, [0, row0, 0], bar, lat_buf.index(stage), pred=pred)
        _tma_load(rope_desc, [row0, ROPE_COL], bar, rope_buf.index(stage), pred=pred)

    @gluon.jit
    def _ring_start(lat_desc, rope_desc, lat_buf, rope_buf, seqlens_ptr, bt_ptr, stride_bt,
                    b, split, num_splits, page_shift, max_len, len_hint, NS: gl.constexpr,
                    ROPE_COL: gl.constexpr):
        """A dense program's start: the ring's barriers, its token chunk (from the device-side
        length, bounded by the table's row) and the ring's first NS − 1 copies in flight →
        (barriers, seqlen, start, end, n_tiles, the request's block-table row).

        Tile 0's page is looked up while the length is still in flight, at the chunk's start
        for a request of ``len_hint`` tokens (the plan's longest): where the length gives the
        same start — every split of a request that long, and every request's first — the
        first copy waits on one dependent load instead of two (the length, then the table)."""
        bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        for st in gl.static_range(NS):
            mbarrier.init(bars.index(st), count=1)
        fence_async_shared()  # the initialised barriers, before the async proxy
        bt_row = bt_ptr + b.to(gl.int64) * stride_bt
        seqlen = gl.minimum(gl.load(seqlens_ptr + b), max_len)
        guess, _, _ = _split_range(gl.minimum(len_hint, max_len), split, num_splits, BN)
        row0 = _tile_row(bt_row, guess, max_len, page_shift)  # (inside the table's row)
        start, end, n_tiles = _split_range(seqlen, split, num_splits, BN)
        if start != guess:
            row0 = _tile_row(bt_row, start, end, page_shift)
        _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, 0, row0, n_tiles > 0, ROPE_COL)
        for st in gl.static_range(1, NS - 1):
            _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, st,
                   _tile_row(bt_row, start + st * BN, end, page_shift), st < n_tiles, ROPE_COL)
        return bars, seqlen, start, end, n_tiles, bt_row

    @gluon.jit
    def _issue_next(lat_desc, rope_desc, lat_buf, rope_buf, bars, i, n_tiles, row_next,
                    bt_row, start, end, page_shift, NS: gl.constexpr, ROPE_COL: gl.constexpr):
        """In tile i, once every warp is past tile i − 1: copy tile i + NS − 1 (pool row
        ``row_next``) into tile i − 1's stage → the pool row of the copy after it (looked up a
        tile before its issue waits on it)."""
        nxt = i + NS - 1
        _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, nxt % NS, row_next, nxt < n_tiles,
               ROPE_COL)
        return _tile_row(bt_row, start + (nxt + 1) * BN, end, page_shift)

    @gluon.jit
    def _rows(r, num_heads, S_Q: gl.constexpr, HEADS: gl.constexpr):
        """Row r's (s_q index, head) and whether it exists."""
        qi = r // HEADS
        head = r % HEADS
        return qi, head, (r < S_Q * HEADS) & (head < num_heads)

    @gluon.jit
    def _q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, col0,
                WIDTH: gl.constexpr, S_Q: gl.constexpr, HEADS: gl.constexpr, R: gl.constexpr):
        """q's dims col0 … col0 + WIDTH − 1 of the R rows, fp16 [R, WIDTH] (zeros where a row
        does not exist), 16-byte loads."""
        return _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, col0, WIDTH, S_Q,
                      HEADS, R).to(gl.float16)

    @gluon.jit
    def _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, col0,
               WIDTH: gl.constexpr, S_Q: gl.constexpr, HEADS: gl.constexpr, R: gl.constexpr):
        """`_q_rows` as q's own dtype (bf16)."""
        r = gl.arange(0, R, layout=gl.SliceLayout(1, Q_ROWS))
        qi, head, ok = _rows(r, num_heads, S_Q, HEADS)
        row = q_ptr + b.to(gl.int64) * stride_qb + qi * stride_qs + head * stride_qh + col0
        c = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, Q_ROWS))
        return gl.load(row[:, None] + c[None, :], mask=ok[:, None], other=0.0)

    @gluon.jit
    def _q8_halves(x, scale, q8, row0: gl.constexpr, R: gl.constexpr):
        """Store rows ``x`` (bf16 [R, W]) times ``scale`` (per row) as e4m3 halves: hi = e4m3(x ·
        scale) at rows row0 … of ``q8``, lo = e4m3(16 · (x · scale − hi)) R rows further on
        (bf16 has 8 significant bits, each half holds 4: hi + lo / 16 is exact wherever both
        stay inside e4m3's exponent range)."""
        xs = x.to(gl.float32) * scale[:, None]
        hi = xs.to(gl.float8e4nv)
        q8.slice(row0, R, dim=0).store(hi)
        q8.slice(row0 + R, R, dim=0).store(((xs - hi.to(gl.float32)) * 16.0).to(gl.float8e4nv))

    @gluon.jit
    def _q8_latent(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, S_Q: gl.constexpr,
                   HEADS: gl.constexpr, R: gl.constexpr):
        """q's latent rows as four bf16 [R, 128] chunks (`_q_raw`) and their max |q| per row."""
        x0 = _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 0, 128, S_Q, HEADS, R)
        x1 = _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 128, 128, S_Q, HEADS,
                    R)
        x2 = _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 256, 128, S_Q, HEADS,
                    R)
        x3 = _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 384, 128, S_Q, HEADS,
                    R)
        m = gl.maximum(gl.maximum(gl.max(gl.abs(x0), axis=1), gl.max(gl.abs(x1), axis=1)),
                       gl.maximum(gl.max(gl.abs(x2), axis=1), gl.max(gl.abs(x3), axis=1)))
        return x0, x1, x2, x3, m.to(gl.float32)

    @gluon.jit
    def _q8_store_latent(q8_lat, x0, x1, x2, x3, m, R: gl.constexpr):
        """The latent chunks times 2^e per row (the largest e with ``m`` · 2^e ≤ 224, so neither
        half overflows e4m3) as `_q8_halves`, chunk c's at rows 2R·c of ``q8_lat`` [8R, 128]
        → e per row (an integer, as float32)."""
        e = gl.floor(gl.log2(224.0 / gl.maximum(m, 2.0**-100)))
        scale = gl.exp2(e)
        _q8_halves(x0, scale, q8_lat, 0, R)
        _q8_halves(x1, scale, q8_lat, 2 * R, R)
        _q8_halves(x2, scale, q8_lat, 4 * R, R)
        _q8_halves(x3, scale, q8_lat, 6 * R, R)
        return e

    @gluon.jit
    def _q8_stage(q8_lat, q8_rope, q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads,
                  S_Q: gl.constexpr, HEADS: gl.constexpr, R: gl.constexpr):
        """qᵀ for the FP8 first product over fp8 rows (`_scores_fp8`): the latent by
        `_q8_store_latent` and the rope the same way into ``q8_rope`` [2R, 64], one power of
        two per row for both (from the max over all 576 dims) → 2^−e per row, fp32 [R] in the
        scores' column layout."""
        x0, x1, x2, x3, m = _q8_latent(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads,
                                       S_Q, HEADS, R)
        xr = _q_raw(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 512, 64, S_Q, HEADS,
                    R)
        m = gl.maximum(m, gl.convert_layout(gl.max(gl.abs(xr), axis=1).to(gl.float32),
                                            m.type.layout))
        e = _q8_store_latent(q8_lat, x0, x1, x2, x3, m, R)
        _q8_halves(xr, gl.convert_layout(gl.exp2(e), gl.SliceLayout(1, xr.type.layout)), q8_rope,
                   0, R)
        return gl.convert_layout(gl.exp2(-e), gl.SliceLayout(0, MMA))

    @gluon.jit
    def _wg8(a, q8, row0: gl.constexpr, R: gl.constexpr, z):
        """One chunk's K · q_halfᵀ (``a``: the chunk's [64, W] e4m3 tile; q's half at rows
        row0 … row0 + R − 1 of ``q8``) into a fresh accumulator (``z``: its layout), issued
        asynchronously."""
        return warpgroup_mma(a, q8.slice(row0, R, dim=0).permute((1, 0)), z, use_acc=False,
                             is_async=True)

    @gluon.jit
    def _wg8_latent(k8, q8_lat, R: gl.constexpr, z):
        """`_wg8` over a stage's four latent chunks (``k8``: [4 · 64, 128] e4m3) against both of
        q's halves (`_q8_store_latent`'s rows) → (hi, lo) of chunks 0 … 3, issued."""
        h0 = _wg8(k8.slice(0, BN, dim=0), q8_lat, 0, R, z)
        l0 = _wg8(k8.slice(0, BN, dim=0), q8_lat, R, R, z)
        h1 = _wg8(k8.slice(BN, BN, dim=0), q8_lat, 2 * R, R, z)
        l1 = _wg8(k8.slice(BN, BN, dim=0), q8_lat, 3 * R, R, z)
        h2 = _wg8(k8.slice(2 * BN, BN, dim=0), q8_lat, 4 * R, R, z)
        l2 = _wg8(k8.slice(2 * BN, BN, dim=0), q8_lat, 5 * R, R, z)
        h3 = _wg8(k8.slice(3 * BN, BN, dim=0), q8_lat, 6 * R, R, z)
        l3 = _wg8(k8.slice(3 * BN, BN, dim=0), q8_lat, 7 * R, R, z)
        return h0, l0, h1, l1, h2, l2, h3, l3

    @gluon.jit
    def _scores_fp8(lat, rope, q8_lat, q8_rope, R: gl.constexpr):
        """A tile's Sᵀ [64 tokens, R rows] (rows scaled as `_q8_stage` left them) from a ring
        stage by FP8 wgmma: the stage's e4m3 bytes are the A operand as the TMA wrote them (no
        conversion, no register loads), q's halves the B operand. Each chunk's half in its own
        accumulator (the wgmma's FP8 sums are kept to ~14 bits; chains of ≤ 128 dims, added in
        float32, as DeepSeek-V3 promotes them), all issued before one wait; in the 8-row
        form's MMA layout."""
        WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, R, 32])
        k8 = _view(lat, gl.float8e4nv, [4 * BN, 128], Q8_LAT)
        r8 = _view(rope, gl.float8e4nv, [BN, 64], Q8_ROPE)
        z = warpgroup_mma_init(gl.zeros([BN, R], gl.float32, layout=WG))
        h0, l0, h1, l1, h2, l2, h3, l3 = _wg8_latent(k8, q8_lat, R, z)
        hr = _wg8(r8, q8_rope, 0, R, z)
        lr = _wg8(r8, q8_rope, R, R, z)
        h0, l0, h1, l1, h2, l2, h3, l3, hr, lr = warpgroup_mma_wait(
            0, deps=[h0, l0, h1, l1, h2, l2, h3, l3, hr, lr])
        s = ((h0 + h1) + (h2 + h3)) + hr + (((l0 + l1) + (l2 + l3)) + lr) * 0.0625
        return gl.convert_layout(s, MMA)

    @gluon.jit
    def _q_lanes(lanes, row0, w0, WORDS: gl.constexpr, n: gl.constexpr):
        """qᵀ's four lanes over words w0 … w0 + WORDS − 1 from the staged q (a `Q_LANES_*` or
        `Q_WIDE_LANES_*` view of ``n`` words a lane, its slot's rows from row0; lane j: fp16
        [WORDS, R], element (w, r) = q[row r, dim 4w + j]) as B operands."""
        return (lanes.slice(row0 + w0, WORDS, dim=0).load(QB),
                lanes.slice(row0 + n + w0, WORDS, dim=0).load(QB),
                lanes.slice(row0 + 2 * n + w0, WORDS, dim=0).load(QB),
                lanes.slice(row0 + 3 * n + w0, WORDS, dim=0).load(QB))

    @gluon.jit
    def _scores_chunk(words, qt, s0, s1, s2, s3):
        """Lane j's scores s_j += one block of K's words (int32 [64, W], loaded as A), lane j ·
        qᵀ's lane j: four independent MMA chains."""
        k0, k1, k2, k3 = _f16_lanes(words)
        return (mma_v2(k0, qt[0], s0), mma_v2(k1, qt[1], s1), mma_v2(k2, qt[2], s2),
                mma_v2(k3, qt[3], s3))

    @gluon.jit
    def _stamp_exit(stamp_ptr):
        """The timeline's exit stamp (`_stamp` 4) and this SM's id at ``stamp_ptr`` [10]."""
        _stamp(stamp_ptr, 4)
        smid = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32,
                                         is_pure=False, pack=1)
        gl.store(stamp_ptr + 10, smid.to(gl.int64))

    @gluon.jit
    def _stage_q(q_lat, q_rope, q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads,
                 S_Q: gl.constexpr, HEADS: gl.constexpr, R: gl.constexpr):
        """Stage the R rows of q for the first product's B operands (`_q_operands`): 8 rows into
        the 32 KB ``q_lat`` (a ring stage's bytes; the latent in slot 0 of `Q_STORE_LAT`'s view,
        8 KB, the rope's in slot 2 of `Q_STORE_ROPE`'s; ``q_rope`` unused), 16 into ``q_lat``
        [16, 512] / ``q_rope`` [16, 64] (`Q_WIDE_STORE_*`). A CTA barrier must follow."""
        if R == NR:
            _view(q_lat, gl.float16, [4 * NR, 512], Q_STORE_LAT).slice(0, NR, dim=0).store(
                _q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 0, 512, S_Q,
                        HEADS, R))
            rope_rows = _view(q_lat, gl.float16, [8 * NR, 256], Q_STORE_ROPE).slice(
                2 * NR, NR, dim=0)
            rope_rows.slice(0, 64, dim=1).store(
                _q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 512, 64, S_Q,
                        HEADS, R))
        else:
            q_lat.store(_q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 0, 512,
                                S_Q, HEADS, R))
            q_rope.store(_q_rows(q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, 512,
                                 64, S_Q, HEADS, R))

    @gluon.jit
    def _q_operands(q_lat, q_rope, R: gl.constexpr):
        """qᵀ as `_scores_mma` takes it from q staged by `_stage_q` → (qs, lanes, rope_lanes):
        8 rows held in registers (`_q_registers`); 16 read every tile through the
        `Q_WIDE_LANES_*` views (qs then unused: the latent's view stands in, a jit function
        returns no None)."""
        if R == NR:
            return _q_registers(q_lat)
        else:
            lanes = _view(q_lat, gl.float16, [4 * 128, R], Q_WIDE_LANES_LAT)
            return lanes, lanes, _view(q_rope, gl.float16, [4 * 16, R], Q_WIDE_LANES_ROPE)

    @gluon.jit
    def _q_registers(buf):
        """qᵀ of 8 rows for the first product's B operands, from q as staged in the 32 KB
        ``buf`` (latent rows in slot 0 of `Q_STORE_LAT`'s view, the rope's in slot 2 of
        `Q_STORE_ROPE`'s) → (the `_q_lanes` of the latent's four 32-word chunks and the rope,
        the latent's and rope's lane views)."""
        lanes = _view(buf, gl.float16, [4 * 4 * 128, NR], Q_LANES_LAT)
        rope_lanes = _view(buf, gl.float16, [8 * 4 * 64, NR], Q_LANES_ROPE)
        qs = (_q_lanes(lanes, 0, 0, 32, 128), _q_lanes(lanes, 0, 32, 32, 128),
              _q_lanes(lanes, 0, 64, 32, 128), _q_lanes(lanes, 0, 96, 32, 128),
              _q_lanes(rope_lanes, 2 * 4 * 64, 0, 16, 64))
        return qs, lanes, rope_lanes

    @gluon.jit
    def _tile_masks(end, seqlen, num_heads, S_Q: gl.constexpr, HEADS: gl.constexpr,
                    CAUSAL: gl.constexpr, R: gl.constexpr):
        """What a chunk's tiles are masked with: the scores' token offsets [64], each row's
        last visible position (`_last_positions`), the last one every row sees, and the second
        product's token offsets [16] in its A-operand layout."""
        t = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
        last = _last_positions(end, seqlen, num_heads, S_Q, HEADS, CAUSAL, R)
        if CAUSAL:  # the last position every row sees
            last_all = gl.minimum(end - 1, seqlen - S_Q)
        else:
            last_all = end - 1
        return t, last, last_all, gl.arange(0, 16, layout=gl.SliceLayout(0, KA))

    @gluon.jit
    def _scores_mma(lat, rope, qs, lanes, rope_lanes, R: gl.constexpr):
        """A ring stage's scores K · qᵀ by mma.sync, fp32 [64, R] in the MMA layout (``lat`` /
        ``rope``: the stage's latent and rope buffers): qᵀ from registers at 8 rows (``qs``:
        `_q_lanes` of the latent's four 32-word chunks and the rope), read from the staged q
        at 16 (``lanes`` / ``rope_lanes``: `Q_WIDE_LANES_*` views); the others None."""
        kw = _view(lat, gl.int32, [BN, 128], K_WORDS)
        rw = _view(rope, gl.int32, [BN, 16], R_WORDS)
        s0 = gl.zeros([BN, R], gl.float32, layout=MMA)
        s1, s2, s3 = s0, s0, s0
        for c in gl.static_range(4):
            if R == NR:
                qt = qs[c]
            else:
                qt = _q_lanes(lanes, 0, 32 * c, 32, 128)
            s0, s1, s2, s3 = _scores_chunk(kw.slice(32 * c, 32, dim=1).load(KA), qt,
                                           s0, s1, s2, s3)
        if R == NR:
            qt = qs[4]
        else:
            qt = _q_lanes(rope_lanes, 0, 0, 16, 16)
        s0, s1, s2, s3 = _scores_chunk(rw.load(KA), qt, s0, s1, s2, s3)
        return (s0 + s1) + (s2 + s3)

    @gluon.jit
    def _softmax_tile(s, n0, t, last, last_all, qk_scale, m_i, l_acc):
        """The online softmax down each column for the tile at position ``n0`` (base 2;
        positions past a row's ``last`` masked unless every row sees the whole tile; a tile
        with nothing visible while nothing was before leaves the state as it is) → (P, the
        accumulators' factor per row, the running max, P's sums per thread)."""
        if n0 + BN - 1 <= last_all:  # every position visible to every row: no mask
            s = s * qk_scale
        else:
            s = gl.where((n0 + t)[:, None] <= last[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no −inf − −inf
        p = gl.exp2(s - m_ref[None, :])
        alpha1 = gl.exp2(m_i - m_ref)
        return p, alpha1, m_new, l_acc * alpha1[None, :] + p

    @gluon.jit
    def _rescale(alpha, acc0, acc1, acc2, acc3):
        """The four accumulators [128, R] times ``alpha`` (per column, [1, R])."""
        return acc0 * alpha, acc1 * alpha, acc2 * alpha, acc3 * alpha

    @gluon.jit
    def _pv_tile(lat, p_buf, n0, end, tv, alpha1, acc0, acc1, acc2, acc3):
        """Oᵀ += Vᵀ · Pᵀ for the tile at position ``n0`` (``lat``: its stage's latent; ``p_buf``:
        its P, whole), the accumulators first rescaled by ``alpha1`` where some row's max grew;
        words of positions from ``end`` on zeroed (a page's tail may hold NaN)."""
        if gl.min(alpha1, axis=0) < 1.0:  # some row's max grew (every warp agrees)
            acc0, acc1, acc2, acc3 = _rescale(alpha1[None, :], acc0, acc1, acc2, acc3)
        vw = _view(lat, gl.int32, [128, BN], V_WORDS)
        for kc in gl.static_range(4):
            v = vw.slice(kc * 16, 16, dim=1).load(KA)
            if n0 + BN > end:  # the partial last tile
                v = gl.where((n0 + kc * 16 + tv)[None, :] < end, v, 0)
            v0, v1, v2, v3 = _f16_lanes(v)
            pk = p_buf.slice(kc * 16, 16, dim=0).load(QB)
            acc0 = mma_v2(v0, pk, acc0)
            acc1 = mma_v2(v1, pk, acc1)
            acc2 = mma_v2(v2, pk, acc2)
            acc3 = mma_v2(v3, pk, acc3)
        return acc0, acc1, acc2, acc3

    @gluon.jit
    def _dims_in_order(acc0, acc1, acc2, acc3, scale, STEP: gl.constexpr):
        """The four [128, R] accumulators of a second product, each column times ``scale``, as
        one [R rows, 512 dims] tensor in dim order: joined along new minor axes and relabelled
        (no data moves until a layout conversion). STEP 1, the dense kernel's: row m of acc j
        holds dim 4m + j; STEP 128, the chunked kernels' (`_write_chunks`): dim 128j + d(m),
        d's seven bits m's in the order m5 m4 m2 m1 m0 m6 m3."""
        x = gl.join(gl.join(acc0 * scale[None, :], acc1 * scale[None, :]),
                    gl.join(acc2 * scale[None, :], acc3 * scale[None, :]))  # [m, r, i, t]:
        if STEP == 1:  # acc (2t + i), now [r, m, t, i]: dim 4m + 2t + i
            x = gl.permute(x, (1, 0, 3, 2))
        else:  # m's bits as axes [m6 … m0, r, i, t], now [r, t, i, m5 m4 m2 m1 m0 m6 m3]
            gl.static_assert(STEP == 128, "_dims_in_order: STEP 1 or 128")
            x = gl.reshape(x, [2, 2, 2, 2, 2, 2, 2, scale.shape[0], 2, 2])
            x = gl.permute(x, (7, 9, 8, 1, 2, 4, 5, 6, 0, 3))
        return gl.reshape(x, [scale.shape[0], 512])

    # 16-byte stores (4 `STG.E.128` a thread at 8 rows) instead of the accumulators' own layout's
    # one element a store (32 `STG.E.U16`), H200, flush A/Bs, µs, do_bench's / clean, mean of two
    # pairs: dense fp8 (h200-20261203-s32-6137365-instores-ab.json) B=64 × 8K × 16 104.2 / 100.7
    # → 102.4 / 97.6, × 8 93.7 / 85.3 → 92.8 / 84.5, B=128 × 4K × 8 (2 splits) 94.1 / 85.9 →
    # 93.2 / 85.1, B=1 × 128K × 8 38.4 / 31.4 → 36.9 / 30.2, B=256 × 4K × 8 (direct) 160.3 /
    # 150.8 → 159.6 / 150.1; fp8_ds_mla and sparse (-c5a120d-instores-ab2.json) × 16 B=64 × 8K
    # 122.5 / 117.2 → 119.8 / 114.3, MTP s_q 2 × 16 116.0 / 113.8 → 114.6 / 112.9, B=1 × 128K ×
    # 8 42.8 / 34.7 → 41.9 / 34.1, sparse B=64 × 8 47.0 / 40.6 → 46.1 / 39.5, B=16 × 8 (16
    # splits) 25.0 / 22.4 → 23.7 / 21.0 — but sparse s_q 2 × 4 heads (4 of 8 rows live) 69.7 /
    # 63.1 → 70.5 / 63.9. (bf16 partials' loss at 2–4 splits, with either store, was the
    # combine's: `fp8mla.decode.combine_warps`.)
    @gluon.jit
    def _store_in_order(ptr, row_off, ok, acc0, acc1, acc2, acc3, inv, STEP: gl.constexpr):
        """`_dims_in_order` of the accumulators times ``inv``, converted to ``ptr``'s dtype and
        stored at ptr + row_off[r] + dim for the rows where ``ok``: through a layout of 8
        consecutive dims a thread (one 16-byte store each in bf16; the conversion's round trip
        through shared memory is the compiler's)."""
        x = _dims_in_order(acc0, acc1, acc2, acc3, inv, STEP).to(ptr.dtype.element_ty)
        x = gl.convert_layout(x, OUT_ROWS)
        r = gl.convert_layout(row_off, gl.SliceLayout(1, OUT_ROWS))
        keep = gl.convert_layout(ok, gl.SliceLayout(1, OUT_ROWS))
        c = gl.arange(0, 512, layout=gl.SliceLayout(0, OUT_ROWS))
        gl.store(ptr + r[:, None] + c[None, :], x, mask=keep[:, None])

    @gluon.jit
    def _write_rows(acc0, acc1, acc2, acc3, STEP: gl.constexpr, m_i, l_i, kv_mult, b, split,
                    out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh, lse_empty,
                    num_heads, num_splits, DIRECT: gl.constexpr, S_Q: gl.constexpr,
                    HEADS: gl.constexpr):
        """Normalize the accumulators ([128, R rows] each, their dims as `_dims_in_order` has
        them for STEP) and write the final rows (one split: out, lse — ``lse_empty`` where
        nothing was attended — and max_logits) or this split's partials (workspace rows
        [batch, num_splits, S_Q, num_heads]), 16 bytes a store (`_store_in_order`)."""
        has = l_i != 0.0  # NaN (a NaN score) too: its lse stays NaN, not the empty row's −inf
        lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
        inv = gl.where(has, kv_mult / gl.where(has, l_i, 1.0), 0.0)
        qi, head, ok = _rows(gl.arange(0, m_i.shape[0], layout=gl.SliceLayout(0, MMA)),
                             num_heads, S_Q, HEADS)
        if DIRECT:
            gl.store(lse_ptr + b.to(gl.int64) * stride_lb + qi * stride_ls + head * stride_lh,
                     gl.where(has, lse, lse_empty), mask=ok)
            gl.store(max_ptr + (b * S_Q + qi).to(gl.int64) * num_heads + head, m_i / LOG2E,
                     mask=ok)
            _store_in_order(out_ptr, b.to(gl.int64) * stride_ob + qi * stride_os
                            + head * stride_oh, ok, acc0, acc1, acc2, acc3, inv, STEP)
        else:
            ws = ((b * num_splits + split) * S_Q + qi).to(gl.int64) * num_heads + head
            gl.store(part_lse_ptr + ws, lse, mask=ok)
            gl.store(part_max_ptr + ws, m_i / LOG2E, mask=ok)
            _store_in_order(part_out_ptr, ws * 512, ok, acc0, acc1, acc2, acc3, inv, STEP)

    @gluon.jit
    def _last_positions(end, seqlen, num_heads, S_Q: gl.constexpr, HEADS: gl.constexpr,
                        CAUSAL: gl.constexpr, R: gl.constexpr):
        """Each query row's last visible position, [R] along the scores' columns: the split's
        last (``end`` − 1), and causally query qi sees positions up to seqlen − S_Q + qi."""
        qi, _, _ = _rows(gl.arange(0, R, layout=gl.SliceLayout(0, MMA)), num_heads, S_Q,
                         HEADS)
        if CAUSAL:
            last = gl.minimum(end - 1, seqlen - S_Q + qi)
        else:
            last = gl.zeros_like(qi) + (end - 1)
        return last

    @gluon.jit
    def _head_block_ptrs(q_ptr, out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr,
                         part_max_ptr, stride_qh, stride_oh, stride_lh, HEADS: gl.constexpr):
        """A program's pointers to q, its outputs and its partials moved to its head block's
        first head, h0 = program_id(2) · HEADS (`fp8mla.decode.DecodePlan._head_block`: heads a
        multiple of HEADS, so every block is full and the rows' mask, head < num_heads, holds;
        h0 = 0 in a plan of one block)."""
        h0 = gl.program_id(2) * HEADS
        return (q_ptr + h0 * stride_qh, out_ptr + h0 * stride_oh, lse_ptr + h0 * stride_lh,
                max_ptr + h0, part_out_ptr + h0 * 512, part_lse_ptr + h0, part_max_ptr + h0)

    @gluon.jit
    def _fresh_state(R: gl.constexpr):
        """The online softmax's start for R query rows: the running max per row (−inf), P's
        sums per thread ([64, R], 0) and the four Oᵀ accumulators ([128, R], 0)."""
        m_i = gl.full([R], float("-inf"), gl.float32, layout=gl.SliceLayout(0, MMA))
        l_acc = gl.zeros([BN, R], gl.float32, layout=MMA)
        acc = gl.zeros([128, R], gl.float32, layout=MMA)
        return m_i, l_acc, acc, acc, acc, acc

    @gluon.jit(do_not_specialize=["len_hint"])  # (a hint: no binary per value)
    def _mla_decode_mma8_kernel(
        q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, scale_ptr,
        out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
        stride_qb, stride_qs, stride_qh, stride_bt, stride_ob, stride_os, stride_oh,
        stride_lb, stride_ls, stride_lh,
        softmax_scale, lse_empty, num_heads, num_splits, page_shift, max_len, len_hint,
        DIRECT: gl.constexpr, S_Q: gl.constexpr, HEADS: gl.constexpr, CAUSAL: gl.constexpr,
        R: gl.constexpr, NS: gl.constexpr, stamp_ptr=None, TIMELINE: gl.constexpr = False,
        QK8: gl.constexpr = False, PDL: gl.constexpr = False,
    ):
        """One (request, split) of a dense fp8 decode, all R query rows (R = 8, or 16: the wide
        form). q: bf16 [batch, s_q, heads, 576]; lat_desc / rope_desc: `descriptors` over the
        pool's uint8 [slots, 576] rows; bt_ptr: int32 [batch, pages] block table; seqlens_ptr:
        int32 [batch]; scale_ptr: float32 [1] (the pool's per-tensor scale); out bf16 [batch,
        s_q, heads, 512], lse / max float32 [batch, s_q, heads] (strided), or the
        workspace partials (float32, or bf16: `fp8mla.decode.PARTIALS_BF16_MIN_SPLITS`); NS ≥ 2
        stages; len_hint: the plan's longest request in tokens (what `_ring_start` looks up
        tile 0's page for before the request's own length has loaded). TIMELINE: a debug
        timeline into int64 ``stamp_ptr`` [programs, 12] (`_stamp`: entry, loop start, tile 0
        landed, loop end, exit; the SM). QK8 (the wide form): the first product as FP8 wgmma
        over the ring's bytes (`_scores_fp8`). PDL: the split combine, a programmatic
        dependent, may launch once every program has left its loop (`_launch_dependents`)."""
        gl.static_assert(R == NR or R == 16, "R: 8 or 16 query rows a program")
        gl.static_assert(not QK8 or R == 16, "QK8: the wide form only")
        gl.static_assert(NS >= 2, "NS: a ring of at least two stages")
        b = gl.program_id(0)
        split = gl.program_id(1)
        if TIMELINE:  # [head block, request, split] order: a plan of one block as before
            stamp_ptr += ((gl.program_id(2) * gl.num_programs(0) + b) * num_splits
                          + split).to(gl.int64) * 12
            _stamp(stamp_ptr, 0)
        # head blocks (the wide form): this program's heads from its block's first
        q_ptr, out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr = (
            _head_block_ptrs(q_ptr, out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr,
                             part_max_ptr, stride_qh, stride_oh, stride_lh, HEADS))

        lat_buf = gl.allocate_shared_memory(gl.uint8, [NS, 4, BN, 128], lat_desc.layout)
        rope_buf = gl.allocate_shared_memory(gl.uint8, [NS, BN, 64], rope_desc.layout)
        if R == NR:
            p_s = gl.allocate_shared_memory(gl.float16, [2, BN, R], P_SHARED)
        elif QK8:  # 16 rows, q's e4m3 halves staged for the wgmma
            p_s = gl.allocate_shared_memory(gl.float16, [2, BN, R], P_SHARED_WIDE)
            q8_lat = gl.allocate_shared_memory(gl.float8e4nv, [8 * R, 128], Q8_LAT)
            q8_rope = gl.allocate_shared_memory(gl.float8e4nv, [2 * R, 64], Q8_ROPE)
        else:  # 16 rows: qᵀ stays in shared memory, read every tile
            p_s = gl.allocate_shared_memory(gl.float16, [2, BN, R], P_SHARED_WIDE)
            q_lat = gl.allocate_shared_memory(gl.float16, [R, 512], Q_WIDE_STORE_LAT)
            q_rope = gl.allocate_shared_memory(gl.float16, [R, 64], Q_WIDE_STORE_ROPE)
        # this program's token chunk and the ring's first NS − 1 tiles in flight before q
        bars, seqlen, start, end, n_tiles, bt_row = _ring_start(
            lat_desc, rope_desc, lat_buf, rope_buf, seqlens_ptr, bt_ptr, stride_bt, b, split,
            num_splits, page_shift, max_len, len_hint, NS, 512)
        kv_mult = gl.load(scale_ptr)
        qk_scale = softmax_scale * kv_mult * LOG2E

        if QK8:
            q_inv = _q8_stage(q8_lat, q8_rope, q_ptr, b, stride_qb, stride_qs, stride_qh,
                              num_heads, S_Q, HEADS, R)
            fence_async_shared()  # q's halves, before the wgmma reads them
            _cta_barrier()
        else:
            if R == NR:  # qᵀ into registers through the ring's last stage, whose first copy is
                # issued after a barrier in tile 0
                q_lat = lat_buf.index(NS - 1)
                q_rope = q_lat
            _stage_q(q_lat, q_rope, q_ptr, b, stride_qb, stride_qs, stride_qh, num_heads, S_Q,
                     HEADS, R)
            _cta_barrier()
            qs, lanes, rope_lanes = _q_operands(q_lat, q_rope, R)

        t, last, last_all, tv = _tile_masks(end, seqlen, num_heads, S_Q, HEADS, CAUSAL, R)
        m_i, l_acc, acc0, acc1, acc2, acc3 = _fresh_state(R)
        row_next = _tile_row(bt_row, start + (NS - 1) * BN, end, page_shift)
        if TIMELINE:
            _stamp(stamp_ptr, 1)
        for i in range(n_tiles):
            n0 = start + i * BN
            stage = i % NS
            if NS == 2:  # a 2-stage ring: the next copy issued before this tile's work (a
                # whole tile to land), not after its P barrier
                fence_async_shared()
                _cta_barrier()  # every warp is past tile i − 1: its stage is free
                row_next = _issue_next(lat_desc, rope_desc, lat_buf, rope_buf, bars, i, n_tiles,
                                       row_next, bt_row, start, end, page_shift, NS, 512)
            mbarrier.wait(bars.index(stage), (i // NS) & 1)
            if TIMELINE:
                if i == 0:
                    _stamp(stamp_ptr, 2)
            if QK8:
                s = _scores_fp8(lat_buf.index(stage), rope_buf.index(stage), q8_lat, q8_rope,
                                R) * q_inv[None, :]
            else:
                s = _scores_mma(lat_buf.index(stage), rope_buf.index(stage), qs, lanes,
                                rope_lanes, R)
            p, alpha1, m_i, l_acc = _softmax_tile(s, n0, t, last, last_all, qk_scale, m_i,
                                                  l_acc)
            p_buf = p_s.index(i % 2)
            p_buf.store(p.to(gl.float16))
            fence_async_shared()
            _cta_barrier()  # P is whole (and, NS > 2, every warp past tile i − 1: its stage free)
            if NS > 2:
                row_next = _issue_next(lat_desc, rope_desc, lat_buf, rope_buf, bars, i, n_tiles,
                                       row_next, bt_row, start, end, page_shift, NS, 512)
            acc0, acc1, acc2, acc3 = _pv_tile(lat_buf.index(stage), p_buf, n0, end, tv, alpha1,
                                              acc0, acc1, acc2, acc3)
        for st in gl.static_range(NS):
            mbarrier.invalidate(bars.index(st))
        if PDL:  # the combine may launch (`_launch_dependents`)
            _launch_dependents()
        if TIMELINE:
            _stamp(stamp_ptr, 3)

        _write_rows(acc0, acc1, acc2, acc3, 1, m_i, gl.sum(l_acc, axis=0), kv_mult, b, split,
                    out_ptr, lse_ptr, max_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_ls, stride_lh,
                    lse_empty, num_heads, num_splits, DIRECT, S_Q, HEADS)  # acc_j: dim 4m + j
        if TIMELINE:
            _stamp_exit(stamp_ptr)
