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


@triton.jit
def mma4(a0, a1, a2, a3, b0, b1, b2, b3, acc, DOT_F32: tl.constexpr):
    """acc + Σ_j a_j @ b_j: a product over four lanes (the FP8 kernels' 4-way split of a
    128- or 512-wide contraction)."""
    acc = mma(a0, b0, acc, DOT_F32)
    acc = mma(a1, b1, acc, DOT_F32)
    acc = mma(a2, b2, acc, DOT_F32)
    return mma(a3, b3, acc, DOT_F32)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """float32 → dtype, round to nearest even. bfloat16 is rounded by bits first: the Triton
    interpreter (3.6–3.9) truncates float32 → bfloat16 where GPUs round. NaN stays NaN (the
    GPU's canonical 0x7FFFFFFF would carry into the sign bit)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    return x.to(dtype)
