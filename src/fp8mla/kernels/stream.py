"""The streaming-read ceiling: how fast this GPU can read memory through a Triton kernel."""

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
