"""FP8 e4m3 encode/decode helpers shared by the kernels (device functions only).

Decoding works on 32-bit words holding four e4m3 bytes (byte j of a word is "lane" j): loading
words instead of bytes keeps address arithmetic at one op per four values (docs/DESIGN.md §10).

- `e4m3x4_to_f16_hw`: two packed ``cvt.rn.f16x2.e4m3x2`` per word (SM89+; inline PTX).
- `e4m3x4_to_f16_sw`: integer bit placement, for SM80, which has no e4m3 hardware, and for the
  interpreter. Placing the e4m3 sign/exponent/mantissa bits into an fp16 gives value · 2⁻⁸
  exactly, subnormals included; callers fold 2⁸ into their scale (`SW_DEQUANT_SCALE`). The NaN
  code (0x7F / 0xFF) becomes an fp16 NaN, as the hardware conversion makes it.
Both return the four lanes as fp16 tensors shaped like the input.
"""

import triton
import triton.language as tl

# fp16 bits (sign << 15 | e4m3 magnitude << 7) hold value · 2^-8: the software path's factor.
SW_DEQUANT_SCALE = 256.0


# two words per instance: byte j of words e and e+1 gathered into one 16-bit pair (prmt),
# converted to an f16x2 that already holds lane j's elements e, e+1 — the register pairs an fp16
# MMA operand takes, so no repacking follows (the Gluon kernels issue the same instructions)
E4M3X4_TO_F16_ASM = tl.constexpr("""
        {
        .reg .b32 x, y;
        .reg .b16 x0, x1, y0, y1;
        prmt.b32 x, $4, $5, 0x5140;
        prmt.b32 y, $4, $5, 0x7362;
        mov.b32 {x0, x1}, x;
        mov.b32 {y0, y1}, y;
        cvt.rn.f16x2.e4m3x2 $0, x0;
        cvt.rn.f16x2.e4m3x2 $1, x1;
        cvt.rn.f16x2.e4m3x2 $2, y0;
        cvt.rn.f16x2.e4m3x2 $3, y1;
        }
        """)
E4M3X4_TO_F16_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r,r,r")


@triton.jit
def e4m3x4_to_f16_hw(words):
    return tl.inline_asm_elementwise(
        E4M3X4_TO_F16_ASM,
        E4M3X4_TO_F16_CONSTRAINTS,
        [words],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True,
        pack=2,
    )


@triton.jit
def _lane_sw(words, SHIFT: tl.constexpr):
    b = (words >> SHIFT) & 0xFF
    m = b & 0x7F  # 0x7F is e4m3fn's NaN: fp16's quiet NaN, not the 480 its bits would place
    h = tl.where(m == 0x7F, 0x7E00, m << 7) | ((b & 0x80) << 8)
    return h.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def e4m3x4_to_f16_sw(words):
    return _lane_sw(words, 0), _lane_sw(words, 8), _lane_sw(words, 16), _lane_sw(words, 24)


@triton.jit
def e4m3x4_to_f16(words, HW_FP8: tl.constexpr):
    """Four fp16 lanes of e4m3 words: exact values (HW_FP8) or values · 2⁻⁸ (software)."""
    if HW_FP8:
        return e4m3x4_to_f16_hw(words)
    else:
        return e4m3x4_to_f16_sw(words)


@triton.jit
def e4m3_encode(x):
    """float32 → e4m3fn bits (int32 in [0, 255]); round to nearest even, saturating at ±448;
    NaN → 0x7F (e4m3fn's NaN: a NaN stored stays visible to the hardware conversion and
    dequantize, not clamped into a finite value; both `e4m3x4_to_f16` paths read it as NaN).

    Pure integer/float ops, so every target (SM80 included) and the interpreter agree bit for
    bit with ``torch.Tensor.to(torch.float8_e4m3fn)`` on clamped input.
    """
    nan = x != x
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(x)
    abits = a.to(tl.int32, bitcast=True)
    # normal range (a >= 2^-6): round the fp32 mantissa to 3 bits, rebias the exponent 127 → 7
    rounded = (abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20
    normal = rounded - (120 << 3)
    # subnormal range: multiples of 2^-9, rounded half-to-even by the 2^23 trick
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal)
    return tl.where(nan, 0x7F, sign | code)


@triton.jit
def pow2_ceil(x):
    """Smallest power of two >= x, for positive normal float32 x (bit exact)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
