"""The shared-memory bank model (tests/bank_model.py) against the profile it was checked on, and
the Gluon SM90 kernels' ring accesses conflict-free under it (CPU only: layouts, no GPU)."""

import itertools

import pytest
import torch
import triton
import triton.language as tl

import bank_model as bm
from fp8mla.kernels.decode import _swap_rows, _swapped_rows


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


@triton.jit
def _swap_kernel(x_ptr, y_ptr, pos_ptr, C: tl.constexpr):
    r = tl.arange(0, 64)
    x = tl.load(x_ptr + r[:, None] * C + tl.arange(0, C)[None, :])
    tl.store(y_ptr + r[:, None] * C + tl.arange(0, C)[None, :], _swap_rows(x))
    tl.store(pos_ptr + r, _swapped_rows(64))


def _sigma(r):
    return (r & ~5) | ((r & 1) << 2) | ((r >> 2) & 1)


def test_triton_words_tile_row_swap_is_conflict_free():
    """`fp8mla.decode.TMA_ROW_SWAP` (prepared): the Triton 16-row kernel's reads of a TMA words
    tile, 2× ideal as laid out today, are conflict-free once rows r are relabelled σ(r) —
    the read layout's row bases map through σ (what the sm_90 TTGIR shows with it on)."""
    i32 = bm.nvmma128(4, 64)
    total, ideal = bm.count(bm.TRITON_H16_WORDS, i32, 4, 1)
    assert total == 2 * ideal
    reg, lane, warp = bm.TRITON_H16_WORDS
    swapped = tuple([[_sigma(r), c] for r, c in bases] for bases in (reg, lane, warp))
    assert swapped[1] == [[0, 2], [0, 4], [4, 0], [2, 0], [1, 0]]
    assert _covers(swapped, [64, 128])
    total, ideal = bm.count(swapped, i32, 4, 1)
    assert total == ideal


def test_swap_rows_relabels_tile_and_positions_alike():
    """`_swap_rows` moves row r of a tile to row σ(r), and `_swapped_rows` names the token each
    row then holds: the scores' positions (masks, causality) follow the rows they belong to."""
    x = torch.randint(0, 2**31 - 1, (64, 16), dtype=torch.int32, generator=torch.Generator()
                      .manual_seed(3))
    y, pos = torch.empty_like(x), torch.empty(64, dtype=torch.int32)
    _swap_kernel[(1,)](x, y, pos, C=16)
    sigma = torch.tensor([_sigma(r) for r in range(64)])
    assert sorted(sigma.tolist()) == list(range(64)) and torch.equal(sigma[sigma], torch.arange(64))
    assert torch.equal(pos.long(), sigma)
    assert torch.equal(y, x[sigma])
