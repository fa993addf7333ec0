"""Shared-memory bank conflicts of a register layout over a shared layout, counted offline.

    python tests/bank_model.py

A register layout is given as linear-layout bases (register, lane, warp bits → (row, column)
of a 2-D tile, XOR-combined, as in Triton's `#ttg.linear` / Gluon's DistributedLinearLayout);
a shared layout as a function (row, column) → byte address. Each instruction moves the
contiguous elements of the first register bits per thread; the hardware serves a warp's access
in phases (8 lanes for 16-byte, 16 for 8-byte, 32 for 4-byte accesses), each phase taking as
many wavefronts as the most distinct 4-byte words any one of the 32 banks holds. The model
matched Nsight Compute on the H200: the Gluon kernels' old ring loads, 2 × ideal, were exactly
the excess counted in h200-20261201-s14-9f19755-ncu-* (4 extra wavefronts per 16-byte load).
The cases below are the layouts session 15 compared (the Gluon kernels' own, read from
`fp8mla.kernels.decode_sm90` where this Triton has Gluon), and one Triton kernel's, read from
its sm_90 TTGIR (benchmarks/sass_decode.py compiles it); tests/test_bank_model.py asserts the
Gluon kernels' accesses stay conflict-free.
"""

from __future__ import annotations


def element(bases, index: int) -> tuple[int, int]:
    """(row, column) of bit pattern ``index`` over ``bases`` (XOR of the set bits' bases)."""
    row = col = 0
    for bit, (r, c) in enumerate(bases):
        if index >> bit & 1:
            row ^= r
            col ^= c
    return row, col


def wavefronts(addresses, width: int) -> int:
    """Wavefronts of one warp-wide access of ``width`` bytes per lane at ``addresses``."""
    phase = {4: 32, 8: 16, 16: 8}[width]
    total = 0
    for p0 in range(0, 32, phase):
        banks: dict[int, set[int]] = {}
        for a in addresses[p0:p0 + phase]:
            for word in range(a // 4, (a + width) // 4):
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(words) for words in banks.values())
    return total


def count(layout, address, elem_bytes: int, vec_bits: int) -> tuple[int, int]:
    """(wavefronts, ideal) of moving a whole tile: ``layout`` = (register, lane, warp) bases,
    the first ``vec_bits`` register bits contiguous per access."""
    reg, lane, warp = layout
    width = elem_bytes << vec_bits
    total = ideal = 0
    for group in range(1 << (len(reg) - vec_bits)):
        for w in range(1 << len(warp)):
            addresses = []
            for lane_id in range(32):
                (r1, c1), (r2, c2), (r3, c3) = (element(reg, group << vec_bits),
                                                element(lane, lane_id), element(warp, w))
                addresses.append(address(r1 ^ r2 ^ r3, c1 ^ c2 ^ c3))
            total += wavefronts(addresses, width)
            ideal += 32 * width // 128
    return total, ideal


def blocked(size, threads, warps, shape) -> tuple[list, list, list]:
    """Bases of a 2-D BlockedLayout of order [1, 0] (columns fastest) over ``shape``: the
    thread's own elements, lanes, warps, then register repeats until the shape is covered."""
    reg, lane, warp = [], [], []
    cover = [1, 1]

    def take(out, n, dim):
        for _ in range(n.bit_length() - 1):
            out.append([cover[0], 0] if dim == 0 else [0, cover[1]])
            cover[dim] *= 2
    for out, counts in ((reg, size), (lane, threads), (warp, warps)):
        take(out, counts[1], 1)
        take(out, counts[0], 0)
    take(reg, shape[1] // cover[1], 1)
    take(reg, shape[0] // cover[0], 0)
    return reg, lane, warp


def linear(layout) -> tuple[list, list, list]:
    """Bases of a Gluon DistributedLinearLayout."""
    return layout.reg_bases, layout.lane_bases, layout.warp_bases


def nvmma128(elem_bytes: int, rows: int):
    """NVMMA 128-byte swizzle: columns in blocks of 128 bytes, each block [rows, 128 bytes]
    contiguous, 16-byte chunk j of row r at chunk j ^ (r % 8)."""
    per_row = 128 // elem_bytes

    def address(r: int, c: int) -> int:
        block, col = divmod(c, per_row)
        byte = col * elem_bytes
        return block * rows * 128 + r * 128 + ((byte // 16) ^ (r % 8)) * 16 + byte % 16
    return address


def linear_shared(offset_bases, elem_bytes: int):
    """A Gluon SharedLinearLayout (offset bits → (row, column)) as (row, column) → byte
    address."""
    where = {element(offset_bases, o): o * elem_bytes for o in range(1 << len(offset_bases))}
    return lambda r, c: where[(r, c)]


def mma_a(k: int, m_repeats: int = 1) -> tuple[list, list, list]:
    """The m16n8k16 A operand of 32-bit elements in pairs along K (Gluon's DotOperandLayout,
    k_width 2, over 4 warps along M): [64 · m_repeats, k] — a thread's pair (g, 2t … 2t + 1),
    then rows g + 8, columns + 8, K and M repeats; lane 4g + t; warp w at rows 16w."""
    reg = [[0, 1], [8, 0], [0, 8]] + [[0, 16 << i] for i in range(k.bit_length() - 5)]
    reg += [[64 << i, 0] for i in range(m_repeats.bit_length() - 1)]
    return reg, [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]], [[16, 0], [32, 0]]


# Gluon decode_sm90, a [64, 128]-byte ring chunk (8 warps) and its fp16 conversion: the old
# layout of all three accesses, and the kernel's own
ROWS = blocked([1, 16], [8, 4], [8, 1], [64, 128])


def gluon_layouts() -> dict:
    """decode_sm90's RING_LAYOUT and GATHER_LAYOUT as bases (empty without Gluon)."""
    from fp8mla.kernels import decode_sm90 as k

    if not k.AVAILABLE:
        return {}
    g = k.GATHER_LAYOUT.value
    return {"ring": linear(k.RING_LAYOUT.value),
            "gather": blocked(g.size_per_thread, g.threads_per_warp, g.warps_per_cta,
                              [k.BLOCK_N, 128])}


# Triton `_mla_decode_kernel`, fp8 16-row programs (B=64 H=16): the TMA words tile
# [64 tokens, 128 int32] read into the conversion's layout (#linear in the sm_90 TTGIR)
TRITON_H16_WORDS = ([[0, 1], [0, 8], [0, 16], [0, 32], [0, 64], [32, 0]],
                    [[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]], [[8, 0], [16, 0]])


def main() -> None:
    u8, f16, i32 = nvmma128(1, 64), nvmma128(2, 64), nvmma128(4, 64)
    own = gluon_layouts()
    cases = [("Gluon ring loads, ROWS_LAYOUT (16 B)", ROWS, u8, 1, 4),
             ("Gluon gather writes, ROWS_LAYOUT", ROWS, u8, 1, 4),
             ("Gluon fp16 stores, ROWS_LAYOUT (2 × 16 B)", ROWS, f16, 2, 3)]
    if own:
        cases += [("Gluon ring loads, RING_LAYOUT (8 B)", own["ring"], u8, 1, 3),
                  ("Gluon fp16 stores, RING_LAYOUT", own["ring"], f16, 2, 3),
                  ("Gluon gather writes, GATHER_LAYOUT", own["gather"], u8, 1, 4),
                  ("Gluon fp16 stores, GATHER_LAYOUT (not used)", own["gather"], f16, 2, 3)]
    cases.append(("Triton H=16 words tile → conversion (8 B)", TRITON_H16_WORDS, i32, 4, 1))
    for name, layout, address, elem_bytes, vec_bits in cases:
        total, ideal = count(layout, address, elem_bytes, vec_bits)
        print(f"{name:<46} {total:5d} wavefronts, ideal {ideal:4d} ({total / ideal:.1f}×)")


if __name__ == "__main__":
    main()
