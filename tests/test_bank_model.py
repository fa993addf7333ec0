"""The shared-memory bank model (tests/bank_model.py) against the profile it was checked on, and
the Gluon SM90 kernels' ring accesses conflict-free under it (CPU only: layouts, no GPU)."""

import itertools

import pytest

import bank_model as bm


def _covers(layout, shape):
    """Every element of ``shape`` exactly once."""
    reg, lane, warp = layout
    seen = set()
    for r, l_, w in itertools.product(range(1 << len(reg)), range(1 << len(lane)),
                                      range(1 << len(warp))):
        (a, b), (c, d), (e, f) = bm.element(reg, r), bm.element(lane, l_), bm.element(warp, w)
        seen.add((a ^ c ^ e, b ^ d ^ f))
    return len(seen) == shape[0] * shape[1] == 1 << (len(reg) + len(lane) + len(warp))


def test_blocked_layout_bases_cover_the_tile():
    assert bm.ROWS[0] == [[0, 1], [0, 2], [0, 4], [0, 8], [0, 64]]  # 16 bytes, then col 64
    assert bm.ROWS[1] == [[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]]
    for layout, shape in ((bm.ROWS, [64, 128]),
                          (bm.blocked([1, 16], [4, 8], [8, 1], [64, 128]), [64, 128]),
                          (bm.blocked([1, 4], [4, 8], [4, 1], [64, 32]), [64, 32]),
                          (bm.TRITON_H16_WORDS, [64, 128])):
        assert _covers(layout, shape), shape


def test_model_reproduces_the_profiled_ring_conflicts():
    """Nsight Compute (h200-20261201-s14-9f19755-ncu-*): the old ring loads — 16 bytes per
    lane in ROWS_LAYOUT over the 128-byte swizzle — took exactly 4 wavefronts more than ideal
    each (2.10 M excess over 524,288 loads)."""
    total, ideal = bm.count(bm.ROWS, bm.nvmma128(1, 64), 1, 4)
    loads = 2 * 8  # two 16-byte accesses per lane × 8 warps for a [64, 128]-byte chunk
    assert ideal == 4 * loads and (total - ideal) == 4 * loads
    # the same layout's fp16 stores were conflict-free (ncu: ~0 store conflicts)
    total, ideal = bm.count(bm.ROWS, bm.nvmma128(2, 64), 2, 3)
    assert total == ideal


def test_gluon_ring_accesses_are_conflict_free():
    """decode_sm90's own layouts: the conversion's 8-byte ring loads and 16-byte fp16 stores
    (RING_LAYOUT) and the sparse gather's 16-byte copies (GATHER_LAYOUT)."""
    own = bm.gluon_layouts()
    if not own:
        pytest.skip("this Triton has no Gluon")
    assert _covers(own["ring"], [64, 128]) and _covers(own["gather"], [64, 128])
    for layout, address, elem_bytes, vec_bits in (
            (own["ring"], bm.nvmma128(1, 64), 1, 3), (own["ring"], bm.nvmma128(2, 64), 2, 3),
            (own["gather"], bm.nvmma128(1, 64), 1, 4)):
        total, ideal = bm.count(layout, address, elem_bytes, vec_bits)
        assert total == ideal, (layout, elem_bytes)


def _mma8_tile_excess(k_bits, rope_bits):
    """decode_sm90_mma8's shared-memory reads of one 64-token tile (all 4 warps): product 1's
    K words (four [64, 32] slices) and rope words ([64, 16]), 8-byte A-operand loads, then
    product 2's [128, 16]-word slices, 4-byte loads → (product 1's, product 2's) wavefronts
    beyond ideal."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    lat = bm.linear_shared(k8._k_words_bases(k_bits), 4)
    rope = bm.linear_shared(k8._r_words_bases(rope_bits), 4)
    v = bm.linear_shared(k8.V_WORDS_BASES, 4)
    first = [bm.count(bm.mma_a(32), lambda r, c, c0=c0: lat(r, c + c0), 4, 1)
             for c0 in range(0, 128, 32)]
    first.append(bm.count(bm.mma_a(16), rope, 4, 1))
    second = [bm.count(bm.mma_a(16, 2), lambda r, c, c0=c0: v(r, c + c0), 4, 0)
              for c0 in range(0, 64, 16)]
    return tuple(sum(t - i for t, i in counts) for counts in (first, second))


def test_mma8_reads_are_conflict_free_in_the_permuted_k_order():
    """The stored K order's 2-way conflicts are what Nsight Compute counted on the H200
    (h200-20261201-s18-2bde5d1-ncu-mma8-fp8-B64-H8.txt: 2.37 M over 8,192 tiles, 289 a tile);
    the kernel's K order (`LAT_K_BITS`, `ROPE_K_BITS`) has none, nor has product 2."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    assert _mma8_tile_excess(k8.STORED_BITS, k8.STORED_BITS) == (288, 0)
    assert _mma8_tile_excess(k8.LAT_K_BITS, k8.ROPE_K_BITS) == (0, 0)


def test_mma8_q_lanes_follow_the_k_order():
    """qᵀ's B operand, read through `_q_lanes_bases`, holds at K index k of lane j and row r
    the q element the A operand's K index k multiplies: dim 4 · phys(k) + j, phys(k) the stored
    word `_k_words_bases` puts at K index k — q staged by `_q_store_bases`."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    for word_bits, k_bits, a_bases in ((7, k8.LAT_K_BITS, k8._k_words_bases),
                                       (6, k8.ROPE_K_BITS, k8._r_words_bases)):
        a = bm.linear_shared(a_bases(k_bits), 4)
        store = bm.linear_shared(k8._q_store_bases(word_bits), 2)
        lanes = bm.linear_shared(k8._q_lanes_bases(word_bits, k_bits), 2)
        n = 1 << word_bits
        for kk in range(128 if word_bits == 7 else 16):
            chunk, unit_word = divmod(a(0, kk) // 4, 2 * 64 * 16 if word_bits == 7 else 16)
            phys = chunk * 32 + unit_word if word_bits == 7 else unit_word  # token 0: unswizzled
            for j, r in ((0, 0), (1, 3), (3, 5), (2, 7)):
                assert lanes(j * n + kk, r) == store(r, 4 * phys + j), (word_bits, kk, j, r)


def _wide_q_excess(order, row_xor):
    """decode_sm90_mma8's wide form (16 rows): qᵀ's lanes staged in word order ``order`` with
    row XOR ``row_xor`` (`_q_wide_lanes_bases`), read as the m16n8k16 B operand (4-byte pairs
    along K, 4 warps alike) → wavefronts beyond ideal."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    n = 1 << len(order)
    lanes = bm.linear_shared(k8._q_wide_lanes_bases(order, row_xor), 2)
    b_operand = ([[1, 0], [8, 0]] + [[16 << i, 0] for i in range(n.bit_length() - 5)]
                 + [[0, 8]], [[2, 0], [4, 0], [0, 1], [0, 2], [0, 4]], [[0, 0], [0, 0]])
    excess = 0
    for j in range(4):
        total, ideal = bm.count(b_operand, lambda r, c, j=j: lanes(j * n + r, c), 2, 1)
        excess += total - ideal
    return excess


def test_wide_q_reads_are_conflict_free():
    """The wide form reads all of qᵀ from shared memory every tile: its row XOR (`WIDE_LAT`,
    `WIDE_ROPE`) keeps every load conflict-free; the 8-row staging's (word ^ 8r) or none
    would not."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    assert _wide_q_excess(*k8.WIDE_LAT) == 0
    assert _wide_q_excess(*k8.WIDE_ROPE) == 0
    assert _wide_q_excess(k8.WIDE_LAT[0], [8, 16, 32, 64]) > 0
    assert _wide_q_excess(k8.WIDE_ROPE[0], [0, 0, 0, 0]) > 0


def test_wide_q_lanes_follow_the_k_order():
    """The wide form's qᵀ, read through `_q_wide_lanes_bases`, holds at K index k of lane j and
    row r (all 16) the q element the A operand's K index k multiplies (as
    `test_mma8_q_lanes_follow_the_k_order`), q staged by `_q_wide_store_bases`."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    for (order, row_xor), k_bits, a_bases in (
            (k8.WIDE_LAT, k8.LAT_K_BITS, k8._k_words_bases),
            (k8.WIDE_ROPE, k8.ROPE_K_BITS, k8._r_words_bases)):
        word_bits = len(order)
        a = bm.linear_shared(a_bases(k_bits), 4)
        store = bm.linear_shared(k8._q_wide_store_bases(order, row_xor, k_bits[:word_bits]), 2)
        lanes = bm.linear_shared(k8._q_wide_lanes_bases(order, row_xor), 2)
        n = 1 << word_bits
        for kk in range(n):
            chunk, unit_word = divmod(a(0, kk) // 4, 2 * 64 * 16 if word_bits == 7 else 16)
            phys = chunk * 32 + unit_word if word_bits == 7 else unit_word  # token 0: unswizzled
            for j in range(4):
                for r in range(16):
                    assert lanes(j * n + kk, r) == store(r, 4 * phys + j), (word_bits, kk, j, r)
