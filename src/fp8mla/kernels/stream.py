"""Read floors: how fast this GPU reads memory through a Triton kernel that does nothing else —
streaming (the ceiling every benchmark reports) and gathering whole rows at listed slots (what a
sparse decode's rows cost before any attention)."""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    """int32 addition as a reduction's combine: `tl.sum` would do on the GPU, but triton 3.8's
    interpreter raised on a sum to a scalar that wraps int32 (NumPy 2 refuses the out-of-range
    total; 3.9's converts it as the GPU wraps); a combine of our own takes the interpreter's
    elementwise path, which wraps as the GPU does."""
    return a + b


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                        EVICT: tl.constexpr = ""):
    """Sum int32 words [pid·BLOCK·ITERS, …) so the loads cannot be elided; one int32 out.
    EVICT: the loads' L2 eviction policy ("" or "evict_first")."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n_words, other=0, eviction_policy=EVICT)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def word_runs(row_words: int) -> tuple[int, int, int]:
    """A row of ``row_words`` int32 words as up to three power-of-two runs, longest first (0:
    none) — 164 (fp8_ds_mla's 656 bytes) as 128 + 32 + 4, 144 as 128 + 16 + 0 — so every
    load of `_gather_read_kernel` is a whole power-of-two tile, 16-byte aligned where the
    row's bytes are."""
    runs = [1 << b for b in range(row_words.bit_length() - 1, -1, -1) if row_words >> b & 1]
    if not 1 <= len(runs) <= 3:
        raise ValueError(f"row_words: expected a sum of at most 3 powers of two, got {row_words}")
    return tuple(runs + [0] * (3 - len(runs)))


@triton.jit
def _gather_read_kernel(rows_ptr, idx_ptr, out_ptr, width, R1: tl.constexpr, R2: tl.constexpr,
                        R3: tl.constexpr, ROWS: tl.constexpr, ITERS: tl.constexpr,
                        EVICT: tl.constexpr = ""):
    """Sum whole rows (int32 words [pool, R1 + R2 + R3], read as the runs `word_runs` gives)
    at the slots listed in idx (int32 [lists, width]); program (list, chunk) takes entries
    [chunk·ROWS·ITERS, …) of its list, ROWS at a time. One int32 out a program, [lists,
    chunks]. EVICT: the rows' L2 eviction policy ("" or "evict_first")."""
    lst = tl.program_id(0)
    base = tl.program_id(1) * ROWS * ITERS
    r = tl.arange(0, ROWS)
    a1 = tl.zeros((ROWS, R1), tl.int32)
    if R2 > 0:
        a2 = tl.zeros((ROWS, R2), tl.int32)
    if R3 > 0:
        a3 = tl.zeros((ROWS, R3), tl.int32)
    for i in range(ITERS):
        e = base + i * ROWS + r
        ok = e < width
        slot = tl.load(idx_ptr + lst.to(tl.int64) * width + e, mask=ok, other=0)
        row = rows_ptr + slot.to(tl.int64)[:, None] * (R1 + R2 + R3)
        a1 += tl.load(row + tl.arange(0, R1)[None, :], mask=ok[:, None], other=0,
                      eviction_policy=EVICT)
        if R2 > 0:
            a2 += tl.load(row + R1 + tl.arange(0, R2)[None, :], mask=ok[:, None], other=0,
                          eviction_policy=EVICT)
        if R3 > 0:
            a3 += tl.load(row + R1 + R2 + tl.arange(0, R3)[None, :], mask=ok[:, None], other=0,
                          eviction_policy=EVICT)
    per_row = tl.sum(a1, axis=1)
    if R2 > 0:
        per_row += tl.sum(a2, axis=1)
    if R3 > 0:
        per_row += tl.sum(a3, axis=1)
    total = tl.reduce(per_row, 0, _add)  # sums of random words wrap (mod 2³², checked so)
    tl.store(out_ptr + lst * tl.num_programs(1) + tl.program_id(1), total)
