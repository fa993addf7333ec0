"""Rotary embedding of the 64 rope dims of rows, fused with the copy of the rows' other dims.

Row r of x (D = 64 or 128 dims) belongs to token r // ROWS_PER_TOKEN, whose angles give
cos / sin [tokens, 32]. Pairs are (2i, 2i+1) with INTERLEAVE, else (i, i+32); either way the
output holds [a·cos − b·sin | b·cos + a·sin] (transformers' layout for both conventions). The
rope dims are the row's first 64; with D = 128 the other 64 are copied. Computed in float32,
stored as out's dtype (float32, or bfloat16 rounded to nearest even).
"""

import triton
import triton.language as tl

from fp8mla.kernels.common import round_to


@triton.jit
def _rope_kernel(x_ptr, out_ptr, cos_ptr, sin_ptr, num_rows, stride_xr, stride_or,
                 ROWS_PER_TOKEN: tl.constexpr, D: tl.constexpr, INTERLEAVE: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = (rows < num_rows)[:, None]
    i = tl.arange(0, 32)[None, :]
    x_row = x_ptr + rows.to(tl.int64)[:, None] * stride_xr
    o_row = out_ptr + rows.to(tl.int64)[:, None] * stride_or
    if INTERLEAVE:
        a = tl.load(x_row + 2 * i, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(x_row + 2 * i + 1, mask=ok, other=0.0).to(tl.float32)
    else:
        a = tl.load(x_row + i, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(x_row + 32 + i, mask=ok, other=0.0).to(tl.float32)
    token = (rows // ROWS_PER_TOKEN).to(tl.int64)[:, None]
    c = tl.load(cos_ptr + token * 32 + i, mask=ok, other=0.0)
    s = tl.load(sin_ptr + token * 32 + i, mask=ok, other=0.0)
    out_t = out_ptr.dtype.element_ty
    tl.store(o_row + i, round_to(a * c - b * s, out_t), mask=ok)
    tl.store(o_row + 32 + i, round_to(b * c + a * s, out_t), mask=ok)
    if D == 128:  # the copied half
        j = 64 + tl.arange(0, 64)[None, :]
        tl.store(o_row + j, round_to(tl.load(x_row + j, mask=ok, other=0.0).to(tl.float32),
                                     out_t), mask=ok)
