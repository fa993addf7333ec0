"""Lightning-indexer logits over FP8 keys (launchers; the math is in fp8mla.kernels.indexer,
and for fp8 q of 33+ heads on SM90 in fp8mla.kernels.indexer_sm90: FP8 wgmma over the keys
as copied, to ~14 bits — `SM90_MIN_HEADS`).

`indexer_logits_paged` is the decode form (DeepGEMM's ``fp8_paged_mqa_logits`` layout: a paged
132-byte key cache, s_q 1–4 queries per request, causal among them, or each query its own
length); `indexer_logits_ragged` the prefill form (``fp8_mqa_logits``: contiguous keys, each
query row its own [start, end)).
Both write −inf at every position outside a row's window, up to the output width. A NaN in a
key (its bytes or scale) or in q makes the logits it meets NaN, as the reference's ReLU does:
both kernels take a max that keeps NaN (Triton's interpreter too); `fp8mla.topk` never selects
a NaN logit.
"""

from __future__ import annotations

import warnings

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from fp8mla._checks import MAX_PAGE_SIZE, check_int, check_tensor, is_page_size
from fp8mla.formats import INDEX_HEAD_DIM, INDEX_ROW_BYTES
from fp8mla.kernels.fp8 import SW_DEQUANT_SCALE
from fp8mla.kernels.indexer import _indexer_logits_kernel
from fp8mla.kernels.launch import fast
from fp8mla.runtime import target_for

__all__ = ["indexer_logits_paged", "indexer_logits_ragged", "MAX_INDEX_HEADS"]

MAX_INDEX_HEADS = 64
BLOCK_S = 64
_Q_DTYPES = (torch.float8_e4m3fn, torch.bfloat16, torch.float16)


NUM_STAGES = 2  # 3 measured 28% slower at B=64 ctx 32K (h200-20261129-s4-indexer-variants.json)
MAX_TILES_PER_PROGRAM = 8
# Scores as [keys, heads] (a warpgroup MMA with the keys as rows; the head sum stays within a
# thread's quad) instead of [heads, keys] (a cross-warp reduction through shared memory every
# tile): measured at B=64 × 32K keys 101.3 vs 107.0 µs at 32 heads, 130.5 vs 254.6 at 64
# (h200-20261129-s5-indexer-variants-prefetch.json; sm_90 SASS per 64-key tile 269 vs 349 and
# 300 vs 862 instructions, benchmarks/sass_indexer.py).
KEYS_AS_ROWS = True
# From this many (padded) heads on, the tile loop carries tile i+1's keys and scales in
# registers instead of the compiler's pipeline: 64 heads 130.5 → 120.3 µs (the registers cost
# no occupancy there); at 32 heads it costs two of six programs per SM: 101.3 → 105.0 µs.
PREFETCH_MIN_HEADS = 64
PROGRAMS_PER_SM = 4
NUM_WARPS = 4
# Paged keys on SM90+ with pages of ≥ BLOCK_S keys: each tile's words are one TMA copy, issued
# by the compiler's pipeline TMA_STAGES deep (3: two buffers), with the next tile's page and
# scales looked up during this one (`fp8mla.kernels.indexer`); the register-prefetch loop is
# then unused.
USE_TMA = True
TMA_STAGES = 3
# fp8 q from SM90_MIN_HEADS heads on SM90 (and Gluon): `fp8mla.kernels.indexer_sm90` — each
# key tile's e4m3 bytes, as the TMA copies them, against q's by FP8 wgmma (nothing converted;
# q staged by the kernel, not left to the compiler, which triton 3.8 / 3.9 re-stage every
# tile). Programs of up to SM90_TILES_PER_PROGRAM tiles (q costs one 8 KB copy, not a
# conversion). H100, B=64 × 32K, graph-timed (h100-20261207-s44-*-indexer-variants.json):
# 64 heads 112.9 µs against the Triton kernel's 114.3 on triton 3.6, 113.2 against 141.3 on
# 3.9; 32 heads 110.8 / 112.1 and 111.8 / 113.5 — no gain there. The wgmma's FP8 sums keep
# ~14 bits (the kernel's docstring): against the Triton kernel's exact fp16 products, a
# relative error of at most 2.7e-4 at 64 heads, 5.6e-4 at 32 and 6e-3 at 7 (fewer heads
# average fewer errors) — so under 33 heads the Triton kernel serves, as fast and exact.
USE_SM90 = True
SM90_TILES_PER_PROGRAM = 8
SM90_MIN_HEADS = 33


def tiles_per_program(rows: int, tiles: int, num_sms: int, heads: int = 32,
                      most: int | None = None) -> int:
    """Key tiles (BLOCK_S positions) per program: the most, up to MAX_TILES_PER_PROGRAM (four
    times that from 64 padded heads, whose q costs twice as much to convert), that still leave
    PROGRAMS_PER_SM programs per SM (q is converted once per program; a B=1 decode row of 4K
    keys keeps one tile per program). H200, B=64 × 32K, TMA copies: 64 heads 97.0 / 92.5 /
    90.1 µs at 8 / 16 / 32 tiles; 32 heads 86.2 / 88.6 at 8 / 16
    (h200-20261129-s6-indexer-variants-*.json). ``most``: another cap (the SM90 kernel's)."""
    n = most or MAX_TILES_PER_PROGRAM * (4 if heads >= 64 else 1)
    while n > 1 and rows * triton.cdiv(tiles, n) < PROGRAMS_PER_SM * num_sms:
        n //= 2
    return n


def _sm90_serves(target, q: torch.Tensor, keys: torch.Tensor, paged: bool,
                 page_size: int) -> bool:
    """Whether `fp8mla.kernels.indexer_sm90` (FP8 wgmma on the keys as copied) serves: fp8 q
    of SM90_MIN_HEADS heads or more, a GPU of compute capability 9.0, a Triton with Gluon, keys
    16-byte aligned and, paged, pages of whole 64-key tiles."""
    if not (USE_SM90 and q.dtype == torch.float8_e4m3fn and q.shape[1] >= SM90_MIN_HEADS
            and target.cc == 90 and not target.interpreted and keys.data_ptr() % 16 == 0
            and (not paged or page_size >= BLOCK_S)):
        return False
    from fp8mla.kernels import indexer_sm90  # imports Gluon: only where it may serve

    return indexer_sm90.AVAILABLE


def _num_pages(keys_u8: torch.Tensor, page_size: int, paged: bool) -> int:
    """Pages of a paged index-key pool (flat uint8); 1 for contiguous keys (unused there)."""
    return keys_u8.numel() // (page_size * INDEX_ROW_BYTES) if paged else 1


def _launch_sm90(q, weights, keys_u8, key_scales, block_table, lo, hi, out, *, target,
                 rows_per_req, page_size, paged, row_lens):
    """`_launch` through `fp8mla.kernels.indexer_sm90`; keys_u8: the pool's (paged) or the
    keys' bytes, flat uint8."""
    from fp8mla.kernels import indexer_sm90 as ki

    rows, heads = q.shape[0], q.shape[1]
    tiles = triton.cdiv(out.shape[1], BLOCK_S)
    per_program = tiles_per_program(rows, tiles, target.num_sms, most=SM90_TILES_PER_PROGRAM)
    page_rows = page_size * INDEX_ROW_BYTES // INDEX_HEAD_DIM if paged else 1
    keys = keys_u8.view(torch.float8_e4m3fn).view(-1, INDEX_HEAD_DIM)
    q8 = q.view(torch.uint8)
    fast(ki._indexer_sm90_kernel)[(rows, triton.cdiv(tiles, per_program))](
        q8, weights, ki.descriptor(keys), key_scales, key_scales, block_table, lo, hi, out,
        q8.stride(0), weights.stride(0), block_table.stride(0), out.stride(0), heads,
        out.shape[1], page_size.bit_length() - 1, page_rows, per_program * BLOCK_S,
        _num_pages(keys_u8, page_size, paged), S_Q=rows_per_req,
        H=max(16, triton.next_power_of_2(heads)), PAGED=paged, NS=ki.NS, KSPLIT=ki.KSPLIT,
        ROW_LENS=row_lens, num_warps=ki.NUM_WARPS)
    return out


def _q_view(q: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """q as the kernel reads it: fp8 → int32 words [..., 32]; 16-bit as is."""
    if q.dtype == torch.float8_e4m3fn:  # (`_check_q_w`: on 4-byte boundaries)
        return q.view(torch.int32), True
    return q, False


def _launch(q, weights, keys_u8, key_scales, block_table, lo, hi, out, *,
            rows_per_req, page_size, paged, row_lens=False):
    """keys_u8: the pool's (paged) or the keys' bytes, flat uint8; key_scales: float32, the
    pool seen as float32 words (paged) or the keys' scales; lo / hi: int32 per-row windows, or
    (paged) both the int32 per-request context lengths — per query row with ``row_lens``."""
    rows, heads = q.shape[0], q.shape[1]
    target = target_for(q.device)
    if rows == 0 or out.shape[1] == 0:
        return out
    if _sm90_serves(target, q, keys_u8, paged, page_size):
        return _launch_sm90(q, weights, keys_u8, key_scales, block_table, lo, hi, out,
                            target=target, rows_per_req=rows_per_req, page_size=page_size,
                            paged=paged, row_lens=row_lens)
    keys_u32 = keys_u8.view(torch.int32)
    keys_f32 = keys_u8.view(torch.float32)
    qv, q_fp8 = _q_view(q)
    sw = 1.0 if target.hw_fp8 else SW_DEQUANT_SCALE
    tiles = triton.cdiv(out.shape[1], BLOCK_S)
    h_p2 = max(16, triton.next_power_of_2(heads))
    per_program = tiles_per_program(rows, tiles, target.num_sms, h_p2)
    grid = (rows, triton.cdiv(tiles, per_program))
    tma = (USE_TMA and paged and page_size >= BLOCK_S and target.cc >= 90
           and keys_u32.data_ptr() % 16 == 0)
    keys_desc = None
    if tma:  # pages of [page_size keys × 32 words | page_size scales]: the keys as a 3-D box
        keys_desc = TensorDescriptor(keys_u32, [keys_u32.numel() // (33 * page_size),
                                                page_size, 32], [33 * page_size, 32, 1],
                                     [1, BLOCK_S, 32])
    fast(_indexer_logits_kernel)[grid](
        qv, weights, keys_u32, keys_f32, key_scales, keys_desc, block_table, lo, hi, out,
        qv.stride(0), weights.stride(0), block_table.stride(0), out.stride(0),
        heads, out.shape[1], page_size.bit_length() - 1, per_program * BLOCK_S,
        _num_pages(keys_u8, page_size, paged), S_Q=rows_per_req, H_P2=h_p2, BLOCK_S=BLOCK_S,
        PAGED=paged, Q_FP8=q_fp8, HW_FP8=target.hw_fp8, DOT_F32=target.interpreted,
        OUT_SCALE=sw * (sw if q_fp8 else 1.0), KEYS_AS_ROWS=KEYS_AS_ROWS,
        ROWS_ALIGNED=paged and page_size % 4 == 0,
        PREFETCH=not tma and h_p2 >= PREFETCH_MIN_HEADS, TMA=tma, ROW_LENS=row_lens,
        num_warps=NUM_WARPS, num_stages=TMA_STAGES if tma else NUM_STAGES,
    )
    return out


def _check_q_w(q: torch.Tensor, weights: torch.Tensor, rows: int) -> None:
    heads = q.shape[-2]
    check_int("index heads (q.shape[-2])", heads, lo=1, hi=MAX_INDEX_HEADS)
    if q.shape[-1] != INDEX_HEAD_DIM:
        raise ValueError(f"q: expected index_head_dim {INDEX_HEAD_DIM}, got {q.shape[-1]}")
    if q.stride(-1) != 1 or q.stride(-2) != INDEX_HEAD_DIM:
        raise ValueError("q: expected contiguous [heads, 128] per token")
    if q.dtype == torch.float8_e4m3fn and (q.data_ptr() % 4 or any(s % 4 for s in q.stride()[:-1])):
        raise ValueError(f"q: expected fp8 rows on 4-byte boundaries (both kernels read them as "
                         f"32-bit words), got address % 4 = {q.data_ptr() % 4} and strides "
                         f"{q.stride()}")
    check_tensor("weights", weights, dtype=torch.float32, shape=(rows, heads), device=q.device)
    if weights.stride(1) != 1:
        raise ValueError("weights: expected a contiguous last dimension")


_warned_padded = False


def _packed_pages(key_cache: torch.Tensor) -> torch.Tensor:
    """key_cache as [num_pages, page bytes], packed: a view, or — pages padded apart (a pool
    with a page stride above its page's bytes; the kernels take packed pages) — a copy of
    the whole pool, said once per process."""
    global _warned_padded
    if key_cache.is_contiguous():
        return key_cache.view(key_cache.shape[0], -1)
    if not _warned_padded:
        _warned_padded = True
        warnings.warn(f"key_cache: pages are not packed (strides {key_cache.stride()}); fp8mla "
                      "copies the whole pool on each call (correct, not fast)", stacklevel=3)
    return key_cache.reshape(key_cache.shape[0], -1).contiguous()


def indexer_logits_paged(
    q: torch.Tensor, weights: torch.Tensor, key_cache: torch.Tensor, block_table: torch.Tensor,
    context_lens: torch.Tensor, *, max_len: int, check: bool = True,
) -> torch.Tensor:
    """Decode-time indexer logits from a paged key cache.

    q: [batch, s_q, index_heads, 128] float8_e4m3fn (per-token scale folded into weights) or
    bf16/fp16; weights: float32 [batch · s_q, index_heads]; key_cache: one layer of
    `IndexKeyCache`, uint8 [num_pages, page_size · 132] (or DeepGEMM's [num_pages, page_size, 1,
    132] view); block_table: int32 [batch, max_pages]; context_lens: int32 [batch] — query i
    of s_q (1–4) sees keys s < context_lens[b] − s_q + 1 + i (causal MTP) — or int32
    [batch, s_q], contiguous — query i sees s < context_lens[b, i] (any s_q ≥ 1: DeepGEMM's
    2-D lengths); max_len: the output width.
    Returns float32 [batch · s_q, max_len], −inf outside each row's window.
    """
    check_tensor("q", q, dtype=_Q_DTYPES, ndim=4)
    b, s_q = q.shape[0], q.shape[1]
    row_lens = isinstance(context_lens, torch.Tensor) and context_lens.dim() == 2
    check_int("s_q (q.shape[1])" if row_lens else
              "s_q (q.shape[1]; above 4 with context_lens [batch, s_q] only)", s_q, lo=1,
              hi=None if row_lens else 4)
    _check_q_w(q, weights, b * s_q)
    check_tensor("key_cache", key_cache, dtype=torch.uint8, device=q.device)
    want = (f"uint8 [num_pages ≥ 1, page_size · {INDEX_ROW_BYTES}], page_size a "
            f"power of two in [1, {MAX_PAGE_SIZE}]")
    if key_cache.dim() < 2 or key_cache.numel() == 0:
        raise ValueError(f"key_cache: expected {want}, got {list(key_cache.shape)}")
    pages = _packed_pages(key_cache)
    page_size = pages.shape[1] // INDEX_ROW_BYTES
    if pages.shape[1] % INDEX_ROW_BYTES or not is_page_size(page_size):
        raise ValueError(f"key_cache: expected {want}, got {list(key_cache.shape)}")
    check_tensor("block_table", block_table, dtype=torch.int32, shape=(b, None), device=q.device,
                 contiguous_last=True)
    check_tensor("context_lens", context_lens, dtype=torch.int32,
                 shape=(b, s_q) if row_lens else (b,), device=q.device, contiguous_last=True)
    if row_lens and not context_lens.is_contiguous():
        raise ValueError(f"context_lens: expected a contiguous [batch, s_q] tensor, got strides "
                         f"{context_lens.stride()}")
    check_int("max_len", max_len, lo=0)
    if check and b:
        lens = context_lens.cpu()
        cover = min(block_table.shape[1] * page_size, max_len)
        lo, hi = int(lens.min()), int(lens.max())
        if lo < 0 or hi > cover:
            raise ValueError(f"context_lens: expected values in [0, {cover}] (block table "
                             f"coverage and max_len), got {lo if lo < 0 else hi}")
        if row_lens:  # the pages a request's longest query reads
            lens = lens.amax(dim=1)
        used = (torch.arange(block_table.shape[1]) * page_size)[None, :] < lens[:, None]
        ids = block_table.cpu()[used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= pages.shape[0]):
            raise ValueError(f"block_table: a page within context_lens points outside the pool "
                             f"[0, {pages.shape[0]})")
    out = torch.empty(b * s_q, max_len, dtype=torch.float32, device=q.device)
    flat = pages.view(-1)
    # the kernel derives each row's window from its request's context length (or its own)
    return _launch(q.reshape(b * s_q, q.shape[2], INDEX_HEAD_DIM), weights, flat,
                   flat.view(torch.float32), block_table, context_lens, context_lens, out,
                   rows_per_req=s_q, page_size=page_size, paged=True, row_lens=row_lens)


def indexer_logits_ragged(
    q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, key_scales: torch.Tensor,
    starts: torch.Tensor, ends: torch.Tensor, *, check: bool = True,
) -> torch.Tensor:
    """Prefill indexer logits over contiguous keys, each query row with its own window.

    q: [tokens, index_heads, 128] float8_e4m3fn or bf16/fp16; weights: float32
    [tokens, index_heads]; keys: e4m3 bytes, uint8 (or float8_e4m3fn) [seq, 128]; key_scales:
    float32 [seq]; starts, ends: int32 [tokens], window [start, end) ⊆ [0, seq].
    Returns float32 [tokens, seq], −inf outside each row's window.
    """
    check_tensor("q", q, dtype=_Q_DTYPES, ndim=3)
    t = q.shape[0]
    _check_q_w(q, weights, t)
    check_tensor("keys", keys, dtype=(torch.uint8, torch.float8_e4m3fn),
                 shape=(None, INDEX_HEAD_DIM), device=q.device)
    if not keys.is_contiguous():
        raise ValueError("keys: expected a contiguous [seq, 128] tensor")
    seq = keys.shape[0]
    check_tensor("key_scales", key_scales, dtype=torch.float32, shape=(seq,), device=q.device,
                 contiguous_last=True)
    check_tensor("starts", starts, dtype=torch.int32, shape=(t,), device=q.device,
                 contiguous_last=True)
    check_tensor("ends", ends, dtype=torch.int32, shape=(t,), device=q.device,
                 contiguous_last=True)
    if check and t:
        if int(starts.min()) < 0 or int(ends.max()) > seq or bool((ends < starts).any()):
            raise ValueError(f"starts, ends: expected 0 <= start <= end <= {seq} per row")
    out = torch.empty(t, seq, dtype=torch.float32, device=q.device)
    dummy_table = torch.zeros(1, 1, dtype=torch.int32, device=q.device)
    return _launch(q, weights, keys.view(torch.uint8).view(-1), key_scales, dummy_table,
                   starts, ends, out, rows_per_req=1, page_size=1, paged=False)
