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
