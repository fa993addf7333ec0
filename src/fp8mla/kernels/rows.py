"""Row-wise helpers of the attention layer's prologue: RMSNorm and per-row FP8 quantization.

- `_rms_norm_kernel`: y = w · (x / sqrt(mean(x²) + eps)), the normalised row rounded to x's
  dtype before the weight multiply (transformers' GLM-5 / DeepSeek RMSNorm, rounding included).
- `_quant_rows_kernel`: each row scaled by amax/448 (amax floored at 1e-4) to e4m3 bits, and
  the scale written out (the lightning indexer's q_I).
"""

import triton
import triton.language as tl

from fp8mla.kernels.common import round_to
from fp8mla.kernels.fp8 import e4m3_encode


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, n, eps,
                     BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + r * stride_x + offs, mask=ok, other=0.0)
    xf = x.to(tl.float32)
    y = round_to(xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps), x.dtype)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + r * stride_o + offs, round_to(w.to(tl.float32) * y.to(tl.float32), x.dtype),
             mask=ok)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, scale_ptr, num_rows, stride_x, stride_q,
                       DIM: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < num_rows
    d = tl.arange(0, DIM)
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + d[None, :], mask=ok[:, None],
                other=0.0).to(tl.float32)
    # IEEE divisions (a plain `/` compiles to div.full.f32, within 2 ulp): codes and scales
    # bit-identical to torch's
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4),
                           tl.full((BLOCK_R,), 448.0, tl.float32))
    codes = e4m3_encode(tl.math.div_rn(x, scale[:, None] + tl.zeros_like(x)))
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_q + d[None, :], codes.to(tl.uint8),
             mask=ok[:, None])
    tl.store(scale_ptr + rows, scale, mask=ok)
