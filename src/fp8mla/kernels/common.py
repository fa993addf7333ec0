"""Device helpers shared by the kernel families."""

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, DOT_F32: tl.constexpr):
    """acc + a @ b. The interpreter multiplies raw bf16 bits in tl.dot (triton#11584), so
    interpreted launches (DOT_F32) upcast the operands to float32 first."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)
