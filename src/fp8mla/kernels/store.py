"""Cache writes that quantize on the way in (one program per token).

Layouts: fp8mla.formats. Rows are addressed by slot (page · page_size + offset); slot −1 skips.
"""

import triton
import triton.language as tl

from fp8mla.kernels.fp8 import e4m3_encode, pow2_ceil

FMT_BF16 = tl.constexpr(0)
FMT_FP8 = tl.constexpr(1)
FMT_DS_MLA = tl.constexpr(2)


@triton.jit
def _store_kv_kernel(
    latent_ptr, rope_ptr, slot_ptr, scale_ptr,
    u8_ptr, f32_ptr, bf16_ptr,
    stride_lt, stride_rt, num_slots,
    ROW_BYTES: tl.constexpr, FORMAT: tl.constexpr, POW2: tl.constexpr,
    LATENT: tl.constexpr, ROPE: tl.constexpr, TILE: tl.constexpr,
):
    """Write token t's [latent | rope] (bf16) into cache row slot[t] in the chosen format (a
    slot outside [0, num_slots) — −1, or one only the validating path rejects — writes
    nothing)."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if (slot >= 0) & (slot < num_slots):
        offs_l = tl.arange(0, LATENT)
        offs_r = tl.arange(0, ROPE)
        lat = tl.load(latent_ptr + t * stride_lt + offs_l).to(tl.float32)
        rope = tl.load(rope_ptr + t * stride_rt + offs_r)
        if FORMAT == FMT_BF16:
            row = bf16_ptr + slot * (ROW_BYTES // 2)
            tl.store(row + offs_l, lat.to(tl.bfloat16))
            tl.store(row + LATENT + offs_r, rope.to(tl.bfloat16))
        elif FORMAT == FMT_FP8:
            s = tl.load(scale_ptr)
            row = u8_ptr + slot * ROW_BYTES
            # IEEE divisions (`/` compiles to div.full.f32, within 2 ulp): codes bit-identical
            # to the reference encoder's
            tl.store(row + offs_l, e4m3_encode(tl.math.div_rn(lat, s + tl.zeros_like(lat)))
                     .to(tl.uint8))
            rope_f = rope.to(tl.float32)
            tl.store(row + LATENT + offs_r,
                     e4m3_encode(tl.math.div_rn(rope_f, s + tl.zeros_like(rope_f))).to(tl.uint8))
        else:
            tiles = tl.reshape(lat, (LATENT // TILE, TILE))
            amax = tl.maximum(tl.max(tl.abs(tiles), axis=1), 1e-4)
            scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
            if POW2:
                scale = pow2_ceil(scale)
            q = e4m3_encode(tl.math.div_rn(tiles, scale[:, None] + tl.zeros_like(tiles)))
            row = u8_ptr + slot * ROW_BYTES
            tl.store(row + offs_l, tl.reshape(q, (LATENT,)).to(tl.uint8))
            offs_s = tl.arange(0, LATENT // TILE)
            tl.store(f32_ptr + slot * (ROW_BYTES // 4) + LATENT // 4 + offs_s, scale)
            tl.store(bf16_ptr + slot * (ROW_BYTES // 2) + (LATENT + 16) // 2 + offs_r,
                     rope.to(tl.bfloat16))


@triton.jit
def _store_index_keys_kernel(
    keys_ptr, slot_ptr, u8_ptr, f32_ptr, stride_kt, page_size, num_slots,
    DIM: tl.constexpr, POW2: tl.constexpr,
):
    """Write token t's index key (bf16 [DIM]) as e4m3 bytes + a float32 scale, DeepGEMM's
    paged layout: per page, page_size·DIM key bytes, then page_size scales (a slot outside
    [0, num_slots) writes nothing)."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if (slot >= 0) & (slot < num_slots):
        page = slot // page_size
        off = slot % page_size
        offs = tl.arange(0, DIM)
        k = tl.load(keys_ptr + t * stride_kt + offs).to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(k), axis=0), 1e-4), 448.0)
        if POW2:
            scale = pow2_ceil(scale)
        page_bytes = page_size * (DIM + 4)
        tl.store(u8_ptr + page * page_bytes + off * DIM + offs,
                 e4m3_encode(tl.math.div_rn(k, scale + tl.zeros_like(k))).to(tl.uint8))
        tl.store(f32_ptr + page * (page_bytes // 4) + page_size * (DIM // 4) + off, scale)
