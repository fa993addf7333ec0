"""Read floors: how fast this GPU reads memory through a Triton kernel that does nothing else —
streaming (the ceiling every benchmark reports) and gathering whole rows at listed slots (what a
sparse decode's rows cost before any attention)."""

import triton
import triton.language as tl


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Sum int32 words [pid·BLOCK·ITERS, …) so the loads cannot be elided; one int32 out."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _gather_read_kernel(rows_ptr, idx_ptr, out_ptr, width, ROWS: tl.constexpr,
                        ITERS: tl.constexpr):
    """Sum whole 656-byte rows (int32 words [pool, 164], read as runs of 128, 32 and 4 words,
    each 16-byte aligned) at the slots listed in idx (int32 [lists, width]); program (list,
    chunk) takes entries [chunk·ROWS·ITERS, …) of its list, ROWS at a time. One int32 out a
    program, [lists, chunks]."""
    lst = tl.program_id(0)
    base = tl.program_id(1) * ROWS * ITERS
    r = tl.arange(0, ROWS)
    a = tl.zeros((ROWS, 128), tl.int32)
    b = tl.zeros((ROWS, 32), tl.int32)
    c = tl.zeros((ROWS, 4), tl.int32)
    for i in range(ITERS):
        e = base + i * ROWS + r
        ok = e < width
        slot = tl.load(idx_ptr + lst.to(tl.int64) * width + e, mask=ok, other=0)
        row = rows_ptr + slot.to(tl.int64)[:, None] * 164
        a += tl.load(row + tl.arange(0, 128)[None, :], mask=ok[:, None], other=0)
        b += tl.load(row + 128 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0)
        c += tl.load(row + 160 + tl.arange(0, 4)[None, :], mask=ok[:, None], other=0)
    total = tl.sum(tl.sum(a, axis=1), axis=0) + tl.sum(tl.sum(b, axis=1), axis=0)
    tl.store(out_ptr + lst * tl.num_programs(1) + tl.program_id(1),
             total + tl.sum(tl.sum(c, axis=1), axis=0))
