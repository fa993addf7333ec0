"""Exact top-k selection over logits rows (launcher; the algorithm is in fp8mla.kernels.topk).

The selected set equals ``torch.topk``'s when values are distinct; among equal values the lower
positions win. −inf (and NaN) entries are never selected; a row with fewer than k candidates is
padded with −1. Positions come out in ascending order (not by value). With ``block_table``, each
position is mapped to its physical slot (page · page_size + offset), the index FlashMLA's sparse
kernels take.
"""

from __future__ import annotations

import functools

import torch

from fp8mla._checks import check_int, check_page_size, check_pow2, check_tensor
from fp8mla.kernels.launch import fast
from fp8mla.kernels.topk import _topk_kernel
from fp8mla.kernels.topk_chunked import (
    WS_WORDS,
    _topk_compact_kernel,
    _topk_finish_kernel,
    _topk_pass_kernel,
    _topk_sample_kernel,
)
from fp8mla.runtime import target_for

__all__ = ["topk_indices", "default_chunk", "MAX_TOPK"]

MAX_TOPK = 4096
MIN_BLOCK, MAX_BLOCK = 1024, 8192
# rows longer than this take several programs each (`default_chunk`), while there are
# no more than CHUNKED_ROWS_PER_SM rows per SM (H200, B=64 rows of 16K: 37.5 µs chunked, 59.3
# one program per row; 256 rows of 32K 85 vs 217: h200-20261129-s7-topk-profile.json; more
# rows fill the GPU anyway)
CHUNKED_ABOVE, CHUNK, CHUNKED_ROWS_PER_SM = 8192, 2048, 2
# rows of at most SHORT_CHUNKED logits take CHUNK_SHORT per program: H200, k = 2048, ABAB (µs,
# 1024 / 2048 / 4096 logits a program): 64 rows × 16K 38.2 / 38.4 / 38.7, × 32K 42.1 / 42.8 /
# 43.6, × 64K 79.6 / 76.1 / 78.6, × 128K 129.0 / 120.7 / 127.6; 16 × 32K 35.7 / 36.3 / 36.3,
# 16 × 256K 79.1 / 75.5 / 78.4; 128 × 32K 50.4 / 50.8 / 53.9 (h200-20261202-s20-ed14654-topk-
# chunks.json). Measured at k = 2048 only (the DSA models' k)
SHORT_CHUNKED, CHUNK_SHORT = 32768, 1024
PASSES = 2  # 8-bit digit passes over the whole row before its candidates are compacted
# rows that expect at least SAMPLE_HITS of SAMPLES evenly spread samples among their top k
# (length ≤ 16 k) take a sampled threshold instead of the digit passes
SAMPLES, SAMPLE_HITS = 4096, 256
SAMPLE_WARPS, FINISH_KEYS_PER_WARP = 8, 512  # launch shapes (benchmarks vary them)


@functools.lru_cache(maxsize=16)
def _full_lengths(rows: int, length: int, device: torch.device) -> torch.Tensor:
    """int32 [rows] of ``length`` (read only): made once per shape, so a call without lengths
    launches no fill kernel (nor records one in a CUDA graph)."""
    return torch.full((rows,), length, dtype=torch.int32, device=device)


def _pow2_block(n: int) -> int:
    """The smallest power of two holding n, within [MIN_BLOCK, MAX_BLOCK]."""
    return min(MAX_BLOCK, max(MIN_BLOCK, 1 << max(0, n - 1).bit_length()))


def compact_capacity(k: int) -> int:
    """Candidates a chunked row may keep after its digit passes and still finish in one
    program on registers: room for k plus as many at the prefix (1024–8192)."""
    return _pow2_block(2 * k)


def _block(length: int) -> tuple[int, int, int]:
    """Logits per loop step, a register-resident tail (0: none) and warps. Rows up to 8192 sit
    in registers whole (each of the passes is then one load, not a chain of dependent ones),
    16 per thread: a power-of-two block, plus a tail of at most a quarter of it for a row just
    past one (a 4160-logit row takes 4096 + a 256 tail, not an 8192 block; the tail holds at
    least one key per thread). Compiled for sm_80–sm_120 by tests/test_portability.py;
    registers: benchmarks/sass_topk.py."""
    block = _pow2_block(length)
    warps = max(4, block // 512)
    half = block // 2
    rest = length - half
    if half >= MIN_BLOCK and 0 < rest <= half // 4:
        threads = 32 * max(4, half // 512)
        return half, max(threads, 1 << (rest - 1).bit_length()), threads // 32
    return block, 0, warps


def default_chunk(rows: int, length: int, num_sms: int) -> int:
    """Logits per program of the chunked path for ``rows`` rows of ``length`` logits on a GPU of
    ``num_sms`` SMs, 0 for one program per row: rows longer than CHUNKED_ABOVE while there are
    at most CHUNKED_ROWS_PER_SM rows per SM, CHUNK_SHORT logits a program up to SHORT_CHUNKED,
    CHUNK beyond."""
    if length <= CHUNKED_ABOVE or rows > CHUNKED_ROWS_PER_SM * num_sms:
        return 0
    return CHUNK_SHORT if length <= SHORT_CHUNKED else CHUNK


def topk_indices(
    logits: torch.Tensor, k: int, *, lengths: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None, page_size: int | None = None,
    rows_per_request: int = 1, chunk: int | None = None,
) -> torch.Tensor:
    """Top-k positions per row.

    logits: float32 [rows, length] (last dim contiguous); k: 1–4096; lengths: int32 [rows],
    optional: only positions < lengths[r] are scanned (what lies past them is ignored; a
    length beyond the row counts as the row's length).
    block_table: int32 [requests, max_pages] with page_size: emit slots instead of positions;
    row r belongs to request r // rows_per_request (s_q for decode rows); positions at or past
    the table's max_pages · page_size have no slot and are never chosen.
    chunk: logits per program (a power of two, 1024–8192) to spread each row over several
    programs (`fp8mla.kernels.topk_chunked`); 0: one program per row; None (default):
    `default_chunk`. Either path selects the same positions in the same order. The
    chunked path (B=64 rows of 32K on the H200: 42.1 µs; one program per row: 122 µs) is three
    kernels for rows of ≤ 16 k logits (a sampled threshold) and four beyond (two digit passes),
    each with a small tensor allocated per call; heavy ties (more than compact_capacity(k) keys
    at the threshold) finish over the whole row in one program (B=64 × 32K of a dozen distinct
    values: 155 µs). Its workspace: rows · (272 + 2 · chunks + 2 · compact_capacity(k)) int32
    — 34 KB per row at k = 2048.
    Returns int32 [rows, k].
    """
    check_tensor("logits", logits, dtype=torch.float32, ndim=2, contiguous_last=True)
    rows, length = logits.shape
    check_int("k", k, lo=1, hi=MAX_TOPK)
    check_int("rows_per_request", rows_per_request, lo=1)
    if lengths is None:
        lengths = _full_lengths(rows, length, logits.device)
    else:
        check_tensor("lengths", lengths, dtype=torch.int32, shape=(rows,), device=logits.device,
                     contiguous_last=True)
    to_slots = block_table is not None
    if to_slots:
        check_tensor("block_table", block_table, dtype=torch.int32, ndim=2,
                     device=logits.device, contiguous_last=True)
        if page_size is None:
            raise ValueError("page_size: expected the block table's page size, got None")
        check_page_size(page_size)
        need = -(-rows // rows_per_request)
        if block_table.shape[0] < need:
            raise ValueError(f"block_table: expected at least {need} rows, got "
                             f"{block_table.shape[0]}")
        cover = block_table.shape[1] * page_size
        if cover < length:  # positions past the table have no slot: never candidates
            logits, length = logits[:, :cover], cover
    else:
        block_table = lengths.view(1, -1)  # unused
    out = torch.empty(rows, k, dtype=torch.int32, device=logits.device)
    if chunk is None:
        chunk = default_chunk(rows, length, target_for(logits.device).num_sms)
    if chunk != 0:
        try:
            check_pow2("chunk", chunk, MIN_BLOCK, MAX_BLOCK)
        except (TypeError, ValueError) as e:  # the message names every accepted value
            raise type(e)(f"chunk: expected None, 0 (one program per row) or a power of two in "
                          f"[{MIN_BLOCK}, {MAX_BLOCK}], got {chunk!r}") from None
        if rows and length:
            _chunked(logits, out, block_table, lengths, k, page_size or 1, rows_per_request,
                     to_slots, chunk)
            return out
    if rows:
        block, tail, warps = _block(length)
        fast(_topk_kernel)[(rows,)](
            logits, out, block_table, lengths, logits.stride(0), out.stride(0),
            block_table.stride(0), k, page_size or 1, length,
            BLOCK=block, ONE_BLOCK=length <= block + tail, TAIL=tail,
            ROWS_PER_REQ=rows_per_request,
            TO_SLOTS=to_slots, num_warps=warps,
        )
    return out


def _chunked(logits, out, block_table, lengths, k, page_size, rows_per_request, to_slots,
             chunk):
    found = _candidates(logits, lengths, k, chunk)
    _finish(logits, out, block_table, lengths, k, page_size, rows_per_request, to_slots, chunk,
            *found)
    return found[0]  # ws: per row the radix state and its candidates (compacted when ≤ cap)


def sampled(length: int, k: int) -> bool:
    """Whether the chunked path thresholds rows of ``length`` from a sample (else: digit
    passes): when SAMPLES evenly spread samples are expected to hold SAMPLE_HITS of the top k,
    the threshold aimed at (k + capacity) / 2 candidates misses [k, capacity] only beyond
    ~5 standard deviations; such a row (or heavy ties) finishes over the whole row."""
    return SAMPLES * k >= SAMPLE_HITS * length


def _candidates(logits, lengths, k, chunk):
    """The threshold (sampled, or digit passes) and the compaction: (ws, runs, cval, cpos)."""
    rows, length = logits.shape
    chunks = -(-length // chunk)
    if sampled(length, k):  # the sample kernel sets the state the compaction reads
        ws = torch.empty(rows, WS_WORDS.value, dtype=torch.int32, device=logits.device)
        fast(_topk_sample_kernel)[(rows,)](logits, lengths, ws, logits.stride(0), k, length,
                                           CAP=compact_capacity(k), SAMPLES=SAMPLES,
                                           num_warps=SAMPLE_WARPS)
    else:  # the passes' histograms and tickets start from zero
        ws = torch.zeros(rows, WS_WORDS.value, dtype=torch.int32, device=logits.device)
        for p in range(PASSES):  # one launch per digit; settled rows return at once
            fast(_topk_pass_kernel)[(rows, chunks)](
                logits, lengths, ws, logits.stride(0), k, length, chunks, FIRST=p == 0,
                CHUNK=chunk, num_warps=max(4, chunk // 512))
    return (ws, *_compact(logits, lengths, k, chunk, ws))


def _compact(logits, lengths, k, chunk, ws):
    """Copy each row's candidates (the state in ws says which) into runs: (runs, cval, cpos)."""
    rows, length = logits.shape
    chunks = -(-length // chunk)
    cap = compact_capacity(k)
    dev = logits.device
    runs = torch.empty(rows, chunks, 2, dtype=torch.int32, device=dev)
    cval = torch.empty(rows, cap, dtype=torch.float32, device=dev)  # compacted candidates
    cpos = torch.empty(rows, cap, dtype=torch.int32, device=dev)
    fast(_topk_compact_kernel)[(rows, chunks)](
        logits, lengths, ws, runs, cval, cpos, logits.stride(0), k, length, chunks, CAP=cap,
        CHUNK=chunk, SAMPLED=sampled(length, k), num_warps=max(4, chunk // 512))
    return runs, cval, cpos


def _finish(logits, out, block_table, lengths, k, page_size, rows_per_request, to_slots, chunk,
            ws, runs, cval, cpos):
    """One program per row: the compacted candidates, or (ties past capacity) the whole row.
    Consumes the compaction's output: it reorders runs, cval and cpos in place (run it once
    per `_compact`)."""
    rows, length = logits.shape
    chunks = runs.shape[1]
    cap = cval.shape[1]
    fast(_topk_finish_kernel)[(rows,)](
        logits, lengths, cval, cpos, runs, out, block_table, ws, logits.stride(0), out.stride(0),
        block_table.stride(0), k, page_size, length, chunks, CAP=cap, CHUNK=chunk,
        CHUNKS_P2=max(2, 1 << (chunks - 1).bit_length()), ROWS_PER_REQ=rows_per_request,
        TO_SLOTS=to_slots, SAMPLED=sampled(length, k),
        num_warps=max(4, min(16, cap // FINISH_KEYS_PER_WARP)))
