"""Dense MLA decode over a paged cache: plan once, run many (CUDA-graph safe).

    plan = DecodePlan(batch=64, num_heads=16, kv_format="fp8_ds_mla", page_size=64,
                      cache_seqlens=seqlens, device="cuda")
    out, lse = plan.run(q, kv_cache, block_table, seqlens)

`DecodePlan` fixes the problem (batch, s_q, heads, format, page size) and the split-KV schedule,
and allocates the workspace and outputs. `DecodePlan.run` checks inputs against the plan,
allocates nothing and — with ``check=False`` — never synchronises with the host, so it can be
captured in a CUDA graph and replayed after the buffers' contents (lengths included) change.
Each split's token range is derived on the device from ``cache_seqlens``.
"""

from __future__ import annotations

import math

import torch
import triton
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from fp8mla import formats, numerics
from fp8mla._checks import check_fp8_scale, check_int, check_page_size, check_tensor, same_device
from fp8mla._versions import triton_minor
from fp8mla.formats import KV_DIM, LATENT_DIM, KVFormat
from fp8mla.kernels.decode import (
    FMT_BF16,
    FMT_DS_MLA,
    FMT_FP8,
    _combine_splits_kernel,
    _mla_decode_kernel,
)
from fp8mla.kernels.fp8 import SW_DEQUANT_SCALE
from fp8mla.kernels.launch import OPTIONS, fast
from fp8mla.runtime import (
    DecodeConfig,
    Target,
    block_shared_limit,
    decode_config,
    fit_shared,
    folds_scales,
    resident_programs,
    slots_ahead,
    target_for,
)

__all__ = ["DecodePlan", "dense_decode", "choose_num_splits", "check_paged_inputs"]

_FORMAT_IDS = {"bf16": FMT_BF16, "fp8": FMT_FP8, "fp8_ds_mla": FMT_DS_MLA}
MIN_SPLIT_TILES = 1  # a split is at least one tile; the cost model below weighs the rest
MAX_SPLITS = 256
PROGRAM_OVERHEAD_TILES = 2  # a program's fixed work (q, partial output) in tiles' time
COMBINE_TILE = 4096  # split × dim partials a combine program reads per step (32 a thread at 4
# warps, 128 at 1; `combine_warps`)
COMBINE_PROGRAMS_PER_SM = 2  # dim blocks narrow (512 → 32) until the combine has this many
# SM90: launch the split combine as a programmatic dependent of the decode kernel (CUDA's
# programmatic dependent launch), so its launch overlaps the decode grid's tail instead of
# following it (it waits in `gdc_wait` for the grid's writes). A small, consistent gain: H200,
# ABAB, every pair faster with it — B=64 × 8K × 16 heads fp8 104.8 / 104.8 µs against 105.1 /
# 105.2, B=1 × 128K 39.5 / 39.7 against 39.8 / 40.0, fp8_ds_mla 126.6 against 126.7, the pool
# case 12.9 against 13.2 (h200-20261202-s22-87b29d9-pdl-decode-variants.json); session 11's
# four pairs on the Triton kernel likewise (0.2–0.9 µs). (Merging in the decode kernel instead —
# the last of a group's ≤ 8 splits to finish, counted by an integer atomic, merges its partials —
# measured level at fp8_ds_mla B=64 × 16 heads and 0.5–5 µs slower in the other four cases:
# session 26, h200-20261203-s26-64e3d42-merge-flush-ab.json, source at 64e3d42; not profiled —
# each program's GPU-scope release before it counts and the last one's serial merge, both at
# the grid's tail, are the suspects)
PDL = True
# The decode kernels let the combine launch once every program has left its loop, so that its
# launch overlaps their last writes; False: at the grid's exit, every kernel (the Triton kernel
# has signalled after its loop since session 11, the Gluon kernels since session 31). H200,
# flush A/Bs (µs, do_bench's / clean; h200-20261203-s31-ca59e0e-pdl-ab.json,
# -da86261-pdl-ab2.json), after the loop against at exit: sparse B=64 × 8 heads 46.9 / 40.3
# against 47.4 / 40.9 and 47.2 / 40.6 against 47.6 / 41.1 (means of four), fp8_ds_mla B=1 ×
# 128K × 8 43.7 / 35.7 against 44.2 / 36.2, 64 sparse heads −0.4 / −0.5, the Triton kernel's
# cases −0.2 to −0.5, fp8 × 8 heads −0.1 to −0.4 clean (under do_bench −0.4 to +0.4; both
# columns favoured it at 32 × 8K × 16) — but the fp8 16-row (wide) form at
# B=64 × 8K × 16 +0.2 / +0.6 over eight pairs, so that form keeps the exit (`_launch_sm90`). At
# each program's entry instead (the combine's programs then wait resident through the whole
# decode) every case but the 64-head one was 0.3–1.8 µs slower.
PDL_SIGNAL = True
# Split partials (the normalized per-split outputs) are stored in bfloat16 instead of float32 in
# plans of at least this many splits (2: every split plan; above 1024, a plan's most: none) on
# the kernels where that measured faster (`partials_dtype`): half the workspace traffic — the
# decode's writes and the combine's reads — for one more bf16 rounding of each partial before
# the LSE-weighted sum (the output is bf16 too: its error grows by about one rounding;
# tests/test_decode.py). Session 31 measured bf16 faster from 16 splits on and slower at 2–4
# (h200-20261203-s31-0d56188-partials-ab{,2,3}.json) and set 16; session 32 found the loss in
# the combine (`combine_warps`) and set 2; session 33 measured the kernels session 32 had not.
PARTIALS_BF16_MIN_SPLITS = 2
PARTIALS_BF16_EVERYWHERE = False  # tests: bf16 partials on every kernel (its stores exercised)
# The 64-row Gluon kernels (`fp8mla.kernels.decode_sm90`, dense and sparse) store bf16 rows —
# the output, and their bf16 partials (`partials_dtype`) — 8 dims a thread, one 16-byte store,
# through a relabelling of the accumulator's registers and lanes within each warp
# (`decode_sm90.O_ROWS`: 16 `STS.128` and 16 `LDSM` a thread; offline, sm_90, triton 3.6 and
# 3.9: 16 `STG.E.128` a thread instead of 64 4-byte `STG.E`, no spills, the same shared memory
# and barriers; float32 rows stay in place: in order they spill). Prepared in session 34,
# measured in 35 (H200, µs, do_bench's / clean, the accumulator's stores with float32
# partials → in order with bf16 partials, h200-20261204-s35-a499cda-sm90-rows-ab.json): fp8
# B=32 × 8K × 64 (4 splits) 113.2 / 112.1 → 110.5 / 109.6, B=2 × 32K × 128 (32) 67.4 / 67.2 →
# 66.1 / 65.4, B=1 × 128K × 64 (128) 70.6 / 69.4 → 66.2 / 65.4, one-split B=64 × 8K × 128
# 393.4 / 392.9 → 389.3 / 387.1; sparse B=8 × 64 (16) 28.8 / 27.8 → 28.4 / 27.4, B=64 × 64 (2)
# 75.4 / 74.3 → 72.5 / 71.1, B=128 × 128 (1) 242.7 / 241.5 → 234.3 / 232.9. False: the
# accumulator's layout, two dims a thread (benchmarks A/B it).
SM90_ROWS_IN_ORDER = True
# SM90, fp8 rows, s_q 1, 64-head programs over pages of ≥ 64 tokens: the Gluon kernel
# (`fp8mla.kernels.decode_sm90`), whose two warpgroups split q · Kᵀ instead of both computing
# it (H200, B=64 × 8K × 128 heads: 539 → 393 µs, h200-20261201-s15-bb2dfd3-dense-ab.json).
# False: the Triton kernel everywhere (benchmarks A/B it)
SM90_GLUON = True
# the same for sparse plans of fp8_ds_mla rows (gathered by cp.async:
# `decode_sm90._mla_sparse_sm90_kernel`, which checks each index-list entry itself), taken from
# `SPARSE_SM90_MIN_HEADS` heads on (H200, topk 2048, h200-20261201-s15-a6cb0db-sparse-sm90-ab:
# B=128 × 128 heads 340 → 242 µs, B=64 × 64 heads 102 → 76.0; session 13's first version was
# slower at 64 heads). Below 64 heads in part-empty programs: the Triton kernel's 32- and
# 64-row programs there cost more than a 64-row Gluon program (H200, flush A/B, µs, do_bench's
# / clean, h200-20261204-s36-7dc3c2b-sparse-min-heads-flush-ab.json, Triton → Gluon: fp8_ds_mla
# B=64 × 32 heads 100.4 / 96.7 → 69.2 / 68.1, B=128 × 32 181.0 / 177.7 → 119.4 / 117.5, B=16 ×
# 32 40.1 / 39.0 → 28.6 / 28.3, B=64 × 24 97.8 / 94.8 → 68.8 / 67.9, × 48 99.9 / 98.4 → 71.0 /
# 69.7; fp8 B=64 × 32 81.7 / 77.6 → 64.8 / 63.8); 17: every plan of the Triton kernel's 32-row
# programs (17–32 heads) and up. Its 16-row programs (9–16 heads) stay: faster but at small
# batches (-808d8ec-sparse-16-heads-flush-ab.json, Triton / Gluon: B=64 × 16 66.6 / 63.9 against
# 67.6 / 66.3, B=128 × 16 103.8 / 101.5 against 118.1 / 116.6, B=64 × 12 62.7 / 59.2 against
# 67.3 / 66.2; B=16 × 16 37.2 / 34.7 against 27.5 / 26.8)
SPARSE_SM90_GLUON = True
SPARSE_SM90_MIN_HEADS = 17
# ... and sparse fp8_ds_mla plans of 9–16 heads and at most this many queries (0: none), where
# the Triton kernel's 16-row programs lose to part-empty 64-head ones (H200, flush A/B, µs,
# do_bench's / clean, Triton → Gluon, 16 heads; h200-20261204-s37-e3a61e4-sparse-16-heads-batch-
# flush-ab.json unless marked s36): B=8 31.0 / 29.3 → 21.0 / 20.7, B=16 (s36) 37.2 / 34.7 →
# 27.5 / 26.8, B=24 44.1 / 41.2 → 38.0 / 36.8, B=32 48.1 / 44.5 → 41.2 / 40.0, × 12 heads 43.6
# / 40.2 → 41.1 / 39.6; but B=48 59.2 / 55.1 → 66.6 / 66.2 (two splits: 96 programs on 132
# SMs), B=64 (s36) 66.6 / 63.9 → 67.6 / 66.3, and fp8 rows at B=32 × 16 37.6 / 33.6 → 38.3 /
# 37.8 — those stay on the Triton kernel
SPARSE_SM90_SMALL_BATCH = 32
# SM90, dense fp8_ds_mla rows, 64-head programs, any page size: the sparse Gluon kernel above
# reading each tile's pool rows through the block table (its PAGED form: one cp.async gather
# a row, as over index lists) instead of the Triton kernel. H200, flush A/B, µs, do_bench's /
# clean (h200-20261204-s36-a0ebd3d-ds-paged-flush-ab.json), Triton → Gluon: B=64 × 8K × 128
# 541.6 / 539.1 → 441.3 / 438.1 (331 TFLOPS), pages of 16 614.8 / 613.5 → 438.9 / 436.3,
# pages of 1 644.0 / 641.2 → 447.3 / 444.3, × 64 heads 272.8 / 270.7 → 231.6 / 229.9, B=1 ×
# 128K × 64 85.4 / 84.5 → 73.2 / 72.4, B=128 × 4K × 48 276.8 / 274.8 → 230.6 / 228.5.
# False: the Triton kernel (benchmarks A/B it)
SM90_DS_PAGED = True
# SM90, fp8 rows (per-tensor scale), 64-head programs, on the same gather kernel: sparse plans
# (index lists, as fp8_ds_mla's from `SPARSE_SM90_MIN_HEADS` heads) and dense plans over pages
# shorter than a tile (the TMA kernel takes pages of ≥ 64 tokens); the e4m3 rope gathered and
# converted beside the latent. False: the Triton kernel there (benchmarks A/B it)
SM90_GATHER_FP8 = True
# Dense plans of s_q 2–4 (MTP, causal or not) on the 64-row Gluon kernels above, one query's
# 64 heads a program (grid axis 2: head blocks × s_q), where the Triton kernel holds all of a
# head block's query rows in one program. H200, flush A/B, µs, do_bench's / clean
# (h200-20261204-s36-d0c2cb9-mtp-flush-ab.json), Triton → Gluon: fp8 B=64 × 8K × 128 × s_q 2
# 1057.2 / 1056.0 → 772.7 / 770.7 (378 TFLOPS), × 64 heads 535.2 / 533.6 → 391.3 / 388.2,
# B=2 × 32K × 128 × 2 151.2 / 150.3 → 112.0 / 111.5, B=32 × 4K × 128 × s_q 4 546.9 / 541.4 →
# 400.5 / 396.6; fp8_ds_mla B=64 × 8K × 128 × 2 999.4 / 1004.9 → 876.8 / 872.9, × 64 heads
# 504.4 / 503.5 → 442.7 / 438.8. False: s_q 1 only (benchmarks A/B it)
SM90_MTP = True
# ... and dense plans of s_q 2–4 whose queries' heads fill at most one 64-row program (33–64
# query rows: s_q 4 × 9–16 heads, 3 × 11–21, 2 × 17–32 — dense prefill's groups of four at 16
# heads, MTP at TP8 and TP4) in one program a request and split: rows in [s_q, heads] order, each
# row's causal length its own query's (`decode_sm90._row_keep`), the tiles read once for every
# query. Otherwise the Triton kernel's 64-row programs serve them, whose warps compute q · Kᵀ
# in both warpgroups (the module docstring of `decode_sm90`; 539 → 393 µs at 128 heads).
# Prepared in session 52 without a GPU (offline sm_90 compiles: 236–243 registers, no spills,
# the unpacked kernels' PTX instruction for instruction the same); not yet run, so off by
# default: its GPU tests force it on. Prediction: ~1.35× the Triton kernel's rate where
# compute-bound (fp8 s_q 4 × 16 heads, B=64 × 8K; dense prefill at 16 heads)
SM90_PACKED = False
# (Session 16's Gluon kernels of ≤ 16-row programs with swapped operands — tokens as the
# wgmma M, 128-token tiles over two warpgroups, dense fp8 and sparse fp8_ds_mla — measured
# slower than the Triton kernel they were to replace (B=64 × 8K × 16 heads 139.3 against
# 114.6 µs, sparse B=64 × 8 67.1 against 61.5: h200-20261201-s16-1c82df8-narrow-decode-
# variants.json, -65e243b-narrow-sparse-variants.json), stayed off behind `SM90_NARROW` /
# `SPARSE_SM90_NARROW` once the mma.sync kernels below served those plans, and were removed in
# session 35.)
# SM90, fp8 rows, programs of ≤ 8 query rows (s_q × heads: GLM-5 at TP8) over pages of ≥ 64
# tokens: the Gluon kernel on mma.sync with swapped operands and q in registers
# (`fp8mla.kernels.decode_sm90_mma8`: no padding rows, no q reloads). H200, ABAB against the
# Triton kernel: B=64 × 8K × 8 heads 93.8 / 93.8 µs against 113.0 / 112.4, B=1 × 128K 39.5 /
# 39.5 against 40.5 / 41.1, s_q 2 × 4 heads 93.8 against 113.3, B=128 × 4K 93.9 against 112.7
# (h200-20261201-s18-2bde5d1-mma8-decode-variants.json). False: the Triton kernel
SM90_MMA8 = True
# the same form for sparse plans of fp8_ds_mla rows over index lists, ≤ 8 heads
# (`fp8mla.kernels.decode_sm90_mma8_sparse`: gathered by cp.async into a ring of
# `SPARSE_SM90_MMA8_STAGES` tiles, entries checked in the kernel, one accumulator per scale
# chunk). H200, topk 2048, ABAB against the Triton kernel: B=64 × 8 heads 48.0 / 48.1 µs
# against 60.8 / 61.3, B=128 × 8 73.5 against 99.1, s_q 2 × 4 heads 70.0 against 97.5; its
# 3-stage ring (one program per SM) 56.0 / 56.1 (h200-20261201-s19-e32f025-mma8-sparse-variants)
SPARSE_SM90_MMA8 = True
SPARSE_SM90_MMA8_STAGES = 2
# its first product (per 128-dim scale chunk) as FP8 wgmma over the gathered e4m3 bytes, q's
# latent split once into two e4m3 halves, the bf16 rope as a bf16 wgmma
# (`decode_sm90_mma8_sparse._scores_fp8_scaled`). Off: level on the H200 (ABAB, topk 2048,
# h200-20261202-s24-qk8a-sparse-variants.json: B=64 × 8 heads 47.3 / 47.5 µs against 47.3 /
# 47.9, B=128 × 8 73.2 against 73.6, s_q 2 × 4 heads 70.9 against 70.3), though it needs 161
# registers instead of 234. The GPU tests run it forced on
SPARSE_SM90_MMA8_QK8 = False
# the same tile for dense plans of fp8_ds_mla pages, s_q × heads ≤ 8, pages of ≥ 64 tokens
# (`fp8mla.kernels.decode_sm90_mma8_ds`: each tile two TMA boxes into a ring of
# `SM90_MMA8_DS_STAGES` stages). H200, ABAB against the Triton kernel: B=1 × 128K × 8 heads
# 44.1 / 44.2 µs against 56.7 / 56.9, B=64 × 8K × 8 107.0 / 106.8 against 153.9 / 153.6, s_q 2
# × 4 heads 106.9 against 153.5, the pool case 13.9 against 15.7; 3 stages (one program per
# SM) 43.0 / 43.2 at B=1 but 113.3 / 113.1 at B=64 (h200-20261202-s20-9673ca2-mma8-ds-*)
SM90_MMA8_DS = True
SM90_MMA8_DS_STAGES = 2
# the wide form's first product as FP8 wgmma per scale chunk over the TMA ring's bytes
# (`decode_sm90_mma8_sparse._scores_fp8_scaled`; 255 registers without the 24 B of spills the
# mma.sync form has). H200, ABAB under both flushes (µs, s24-qk8b-flush-ab.json): B=64 × 8K ×
# 16 heads 116.9 / 110.9 and 116.5 / 110.0 against 125.6 / 120.7 and 125.5 / 120.7, s_q 2 × 8
# heads 123.0 / 118.3 against 124.9 / 119.7. Not the 8-row form, which holds qᵀ in registers
# already: B=64 × 8K × 8 heads 110.9 / 103.1 against 108.9 / 100.1, B=1 × 128K 45.1 / 37.6
# against 44.5 / 36.3 (s24-qk8a-flush-ab.json: the same per-chunk accumulators, measured with
# the fp8 form's first version). Off by default since session 25: its scores err by ~1.5e-4 of
# the row's largest logit, ~1.3e-3 where one q element dwarfs the rest (the wgmma's FP8 sums
# keep ~14 bits of each 128-dim chunk's largest term), so rows with logits in the tens or
# outlier channels miss the float32 reference's bf16 tolerance (max |Δout| 0.040 and |Δlse| 0.072
# at q with one element of 300, against 0.008 / 4e-5 on mma.sync;
# h200-20261202-s25-qk8-precision.json, `benchmarks/qk8_precision.py`). On: for speed, where
# that error is acceptable (it is a tenth of what e4m3 keys already cost such a row)
SM90_MMA8_DS_QK8 = False
# fp8_ds_mla plans of 17–32 query rows (MTP s_q 2 × 16 heads, s_q 4 × 8, 32 heads): the wide
# form in head blocks of 16 // s_q heads (`DecodePlan._head_block`; each block's programs read the
# request's pages again, mostly from L2: the blocks of one request run side by side) instead
# of the Triton kernel's 32-row program, where the heads split evenly
SM90_MMA16_DS_HEAD_BLOCKS = True
# fp8 plans of 17–32 query rows the same way, on the fp8 wide form (`decode_sm90_mma8`, R = 16;
# `DecodePlan._head_block`): True / False force it; None (the default) takes it on triton 3.8,
# which stages the Triton kernel's converted FP8 operands through shared memory (its 32-row
# program 1.7× slower than 3.6's), and elsewhere where the blocks' schedule gives each request
# at least `SM90_MMA16_FP8_HEAD_BLOCKS_MIN_SPLITS` splits. H100, ABAB, µs, do_bench's flush
# (h100-20261207-s45-*-decode-variants.json; B=64 × 8K: 2 splits, B=32: 4, B=16 × 8K: 8, B=8
# × 32K: 16, B=1 × 128K: 128):
#   s_q 2 × 16 heads, B=64 × 8K: 3.8 296.4 → 177.4; 3.6 172.9 → 175.2; 3.9 168.0 → 179.7
#   32 heads, B=64 × 8K: 3.8 293.7 → 177.7; 3.6 172.6 → 176.4; 3.9 168.6 → 178.8
#   s_q 2 × 16, B=32 × 8K: 3.6 97.5 → 92.1; 3.9 95.2 → 91.6
#   s_q 2 × 16, B=16 × 8K: 3.6 60.0 → 53.4; 3.9 59.1 → 53.0
#   s_q 2 × 16, B=8 × 32K: 3.8 157.5 → 92.0; 3.6 97.5 → 92.5; 3.9 96.0 → 91.9
#   32 heads, B=1 × 128K: 3.8 88.0 → 54.1; 3.6 60.8 → 54.8; 3.9 61.4 → 53.9
SM90_MMA16_FP8_HEAD_BLOCKS: bool | None = None
SM90_MMA16_FP8_HEAD_BLOCKS_MIN_SPLITS = 4
# (tried, not kept: 3 stages, one program per SM, where that schedule gives programs of ≤ 32
# tiles — faster under
# do_bench's flush (B=1 × 128K 42.4 against 44.2 / 44.1 µs, B=16 × 8K 43.4 against 45.0) but
# not with a clean L2, as a serving step starts: 36.5 / 37.1 against 36.5 / 36.4, 37.9 / 37.7
# against 37.1 / 36.9, B=8 × 32K 60.4 / 60.5 against 57.3 / 57.3; h200-20261202-s23-92cfcfa-
# decode-variants.json, s23-3ce86b0-flush-ab.json)
# the fp8 kernel's wide form for dense plans of 9–16 query rows (s_q × heads: 16 heads, s_q
# 2 × 8): two MMA column blocks, qᵀ read from shared memory every tile instead of held in
# registers, a ring of `SM90_MMA16_STAGES` stages (2: two programs per SM), where the schedule
# gives a program at least `mma16_min_tiles()` tiles (its fixed cost per program — q's
# staging, the ring's fill — loses below: B=24 × 8K, 12 tiles, 55.3 / 55.4 against 53.4 / 53.4,
# s22-0fa10af-decode-variants.json). H200, ABAB against the Triton kernel (16-row
# programs): B=64 × 8K × 16 heads 105.0 / 105.7 µs against 114.8 / 115.1, s_q 2 × 8 106.0
# against 115.7, B=128 × 4K 106.7 against 115.9, B=32 × 8K (16 tiles a program) 63.8 against
# 65.6 (h200-20261202-s21-9271bf1-decode-variants.json); B=16 × 8K and B=1 × 128K (8 tiles)
# 45.5 / 45.7 against 42.3 / 42.6 (s21-42e9e38); 3 stages (one program per SM) 118.2 at B=64.
# `SM90_MMA16_MIN_TILES`: an int forces the length rule; None (the default) is 16 tiles, and
# none on triton 3.8, whose Triton kernel stages its converted FP8 operands through shared
# memory: there the wide form wins at every length measured. H100, ABAB, µs, do_bench's flush
# (h100-20261207-s48-65560b5-triton38-decode-variants.json; Triton kernel → wide form):
#   B=16 × 4K × 16 heads (4 tiles a program) 40.7 → 31.6; B=16 × 8K (8 tiles) 65.6 → 48.1
#   s_q 2 × 8 heads, B=16 × 4K 52.0 → 33.1; B=8 × 4K 34.4 → 23.8
#   32 heads in head blocks, B=1 × 16K 27.0 → 19.6
SM90_MMA16 = True
SM90_MMA16_STAGES = 2
SM90_MMA16_MIN_TILES: int | None = None
# the fp8 wide form's first product q · Kᵀ as FP8 wgmma (`decode_sm90_mma8._scores_fp8`): the
# ring's e4m3 bytes are its A operand as the TMA wrote them, q split once per program into two
# e4m3 halves (exact for bf16 q inside e4m3's exponent range: elements within ~2^13 of the
# row's largest); no conversion, register loads or mma.sync for that product
# (1,006 instructions a tile instead of 1,211, offline sm_90). H200, ABAB under both flushes
# (do_bench's / a clean L2, µs; h200-20261202-s24-qk8b-flush-ab.json): B=64 × 8K × 16 heads
# 103.3 / 98.8 and 103.1 / 98.5 against 103.7 / 99.5 and 103.8 / 99.6, s_q 2 × 8 heads 103.7 /
# 99.4 against 104.4 / 100.2; but programs of 16 tiles (B=8 × 32K × 16) 65.5 / 59.7 against
# 64.6 / 59.7 (q's split is paid per program): taken for programs of ≥
# `SM90_MMA16_QK8_MIN_TILES` tiles. Its first form, one accumulator per half promoted to float32
# every 128 dims by the wgmma's own `max_num_imprecise_acc` (a wait after each chunk), lost 6 µs
# (s24-qk8a-flush-ab.json). Off by default since session 25, as `SM90_MMA8_DS_QK8` (max |Δout|
# 0.078, |Δlse| 0.071 at q with one element of 300; s25-qk8-precision.json): a 0.5% gain does
# not pay for it
SM90_MMA16_QK8 = False
SM90_MMA16_QK8_MIN_TILES = 32
# the same wide form over fp8_ds_mla pages (`decode_sm90_mma8_ds` with 16 rows: qᵀ's latent
# read from shared memory every tile, one P, the copy of tile i + NS − 1 issued at the top of
# tile i; a ring of `SM90_MMA8_DS_STAGES`; `SM90_MMA16_DS_MIN_TILES`: 0, no length rule);
# compiled for sm_90 only (255 registers; no spills on triton 3.9, 24–32 bytes on 3.6; 106 KB
# of shared memory: two programs per SM). H200, ABAB against the Triton kernel (16-row
# programs): B=64 × 8K × 16 heads 125.3 / 125.3 µs against 156.8 / 156.9 (bf16: 157.6), s_q
# 2 × 8 124.3 against 157.1, B=32 × 8K 74.1 against 92.7
# (h200-20261202-s22-e8f3867-wide-ds-decode-variants.json). Unlike
# the fp8 form it wins on short programs too (the fp8_ds_mla Triton kernel is further behind),
# so it has no length rule: 8 tiles a program (B=16 × 8K) 50.0 / 50.0 against 61.0 / 61.1, B=1
# × 128K × 16 heads 50.7 / 50.7 against 63.2 / 63.2 (s22-1380eb4-decode-variants.json); 4 tiles
# (B=8) 37.1 / 37.0 against 46.4 / 46.7, 2 (B=4) 29.6 against 37.6, 1 (B=1 × 4K) 16.1 against
# 16.8 (s22-0fa10af-decode-variants.json)
SM90_MMA16_DS = True
SM90_MMA16_DS_MIN_TILES = 0


def mma8_stages(rows: int) -> int:
    """Ring stages of the dense fp8 ≤ 16-row kernel (`decode_sm90_mma8`) for programs of
    ``rows`` (8 or 16)."""
    from fp8mla.kernels import decode_sm90_mma8 as k8

    return k8.STAGES if rows == k8.ROWS else SM90_MMA16_STAGES


def mma16_min_tiles() -> int:
    """Tiles a program needs for the dense fp8 wide form to serve a plan of 9–16 rows:
    `SM90_MMA16_MIN_TILES` where set, else 0 on triton 3.8 and 16 on other Tritons."""
    if SM90_MMA16_MIN_TILES is not None:
        return SM90_MMA16_MIN_TILES
    return 0 if triton_minor(triton.__version__) == (3, 8) else 16


def choose_num_splits(batch: int, head_blocks: int, max_seqlen: int, slots: int,
                      block_n: int = 64) -> int:
    """Splits per request that minimise the modelled time: waves × (tiles per split + a fixed
    cost per program: q, partial results), where a wave is ``slots`` programs (SMs × programs
    each SM holds at once) and every program of a wave takes as long as its longest. Splits
    hold at least one tile (each program's partial-result traffic is in the fixed cost); ties
    go to fewer splits.

    Measured on the H200 (B=64, 8K, 16 heads, 264 slots): 5 splits (1.2 waves) 232 µs,
    4 splits (one wave) 180 µs, 8 splits (two) 192 µs. A short single request (B=1, 4096
    tokens, or 2048 sparse indices) runs one tile per split: its time is one tile's latency,
    not a chain of them."""
    programs = max(1, batch * head_blocks)
    cap = int(min(MAX_SPLITS, max(1, math.ceil(max_seqlen / (MIN_SPLIT_TILES * block_n)))))
    best, best_cost = 1, None
    for splits in range(1, cap + 1):
        tiles = math.ceil(math.ceil(max(1, max_seqlen) / splits) / block_n)
        cost = math.ceil(programs * splits / max(1, slots)) * (tiles + PROGRAM_OVERHEAD_TILES)
        if best_cost is None or cost < best_cost:
            best, best_cost = splits, cost
    return best


def combine_blocks(rows: int, num_splits: int, num_sms: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_S) of the split combine over ``rows`` (request, query, head) rows:
    latent dims per program narrow from the whole row (512) to 32 while the grid has fewer
    than COMBINE_PROGRAMS_PER_SM programs per SM, and splits per step widen to keep
    COMBINE_TILE values per step. Many rows (B=64 × 16 heads × 4 splits) get one whole-row
    program each, one memory round trip apiece — with 128-dim programs and two dependent loads
    the combine took 13.6 µs of that case's 131 on the H200 (h200-20261130-s10-*-decode-phases).
    Where 32-dim programs would still need more than one step, they narrow to 16 dims so every
    split is read at once: a single long request (B=1, 8 heads, 256 splits) gets 256 programs
    of 16 dims, one step — H200, B=1 × 128K, ABAB against 128 programs × 2 steps: fp8 45.2 /
    45.6 → 45.1 / 45.1 µs, fp8_ds_mla 57.6 / 57.5 → 57.0 / 56.8 (h200-20261201-s13-75a34e4-
    decode-variants.json; the pool case's 64 splits, one step either way, stay at 32 dims)."""
    block_d = LATENT_DIM
    while block_d > 32 and rows * (LATENT_DIM // block_d) < COMBINE_PROGRAMS_PER_SM * num_sms:
        block_d //= 2
    splits = triton.next_power_of_2(max(1, num_splits))
    if block_d == 32 and splits * block_d > COMBINE_TILE:
        block_d = 16
    return block_d, min(splits, COMBINE_TILE // block_d)


def partials_dtype(num_splits: int, kernel: str, kv_format: str, rows: int) -> torch.dtype:
    """The split partials' dtype in a plan of ``num_splits`` splits served by ``kernel`` (a
    `DecodePlan.kernel` name) over ``kv_format`` rows, ``rows`` rows a program: bfloat16 from
    `PARTIALS_BF16_MIN_SPLITS` splits where that measured faster on the H200 (µs, float32 →
    bf16, do_bench's / clean, means of two), else float32:

    - the ≤ 16-row Gluon kernels ("mma8", "mma16"), dense and sparse, at every split count
      (h200-20261203-s32-f2ba160-combine-warps-ab.json): fp8 B=128 × 4K × 8 (2 splits) 92.8 /
      84.1 → 91.7 / 82.7, B=64 × 8K × 16 (4) 101.0 / 96.4 → 98.3 / 93.5, fp8_ds_mla × 16 (4)
      121.0 / 115.2 → 118.2 / 112.3, sparse B=64 × 8 (4) 46.3 / 39.8 → 45.0 / 38.4;
    - the Triton kernel over bf16 rows at ≤ 32 rows (h200-20261203-s33-40810d1-partials-ab,
      -0d53655-rows-ab.json): B=64 × 8K × 16 heads (2) 154.2 / 145.0 → 152.9 / 143.0, × 32
      (4) 219.9 / 218.9 → 211.9 / 210.7;
    - the 64-row Gluon kernels ("sm90"), dense and sparse, whose bf16 rows are stored in dim
      order (`SM90_ROWS_IN_ORDER`; with the accumulator's 4-byte stores bf16 measured slower,
      h200-20261203-s33-40810d1-partials-ab.json): B=32 × 8K × 64 (4) 113.2 / 112.1 → 110.5 /
      109.6, B=2 × 32K × 128 (32) 67.4 / 67.2 → 66.1 / 65.4, B=1 × 128K × 64 (128) 70.6 / 69.4
      → 66.2 / 65.4, sparse B=8 × 64 (16) 28.8 / 27.8 → 28.4 / 27.4, B=64 × 64 (2) 75.4 / 74.3
      → 72.5 / 71.1 (h200-20261204-s35-a499cda-sm90-rows-ab.json; float32 partials with the
      output in order measured within 0.25 µs of the old stores in every split plan).

    Slower, so float32: the Triton kernel over FP8 rows, whose compiles spill with bf16
    stores (sm_90, triton 3.6: 54 local stores at 16 rows against none, 37 against 2 at 32):
    fp8 B=1 × 128K × 8 (256) 39.6 / 37.6 → 43.9 / 41.0, fp8_ds_mla B=64 × 8K × 16 (4) 157.5 /
    152.9 → 161.5 / 158.9, × 64 heads (2) 272.7 / 270.1 → 280.8 / 278.2, fp8 × 32 heads (2)
    169.1 / 167.5 → 174.2 / 172.5 (its exceptions: fp8 B=64 × 8K × 16 (4) 113.8 / 111.2 →
    112.8 / 110.4, s_q 2 × 16 (2) 169.7 / 168.1 → 166.9 / 165.1; -f08c00a-triton-partials-ab).
    A plan whose Gluon kernel falls back to the Triton kernel (a pool not 16-byte aligned)
    keeps its bf16 partials, which that kernel stores too (slower). `PARTIALS_BF16_EVERYWHERE`
    (tests) takes bf16 on every kernel."""
    bf16 = (PARTIALS_BF16_EVERYWHERE or kernel in ("mma8", "mma16")
            or (kernel == "sm90" and SM90_ROWS_IN_ORDER)
            or (kernel == "triton" and kv_format == "bf16" and rows <= 32))
    return torch.bfloat16 if bf16 and num_splits >= PARTIALS_BF16_MIN_SPLITS else torch.float32


def combine_warps(block_d: int, part_bytes: int) -> int:
    """Warps of a split-combine program of ``block_d`` dims over partials of ``part_bytes``
    bytes a value. Triton lays a step's [splits, dims] load out 16 bytes a thread along the
    dims, threads and then warps along a row first: a 512-dim row is 128 threads in float32
    but 64 in bf16, so at 4 warps bf16 stacked the splits across warps, and the sum over them
    went through shared memory (sm_90 PTX: 5 `bar.sync` under triton 3.6, 10 under 3.9, against
    none) — H200, Nsight Compute, fp8 B=128 × 4K × 8 (2 splits): the combine 4.0 µs with
    float32 partials, 7.8 with bf16, the decode kernel 82.2 → 80.5 µs (h200-20261203-s32-3d9c763-
    partials-ncu.txt), which is why bf16 partials lost at 2–4 splits. Programs of ≥ 128 dims
    take as many warps as their row fills (1–4), so every split of a dim range sits in one
    warp; narrower programs (many splits of few rows) one warp, which sums through shuffles
    alone (at 4 warps, 16 dims × 256 splits: 17 `bar.sync` a step under triton 3.9, 21 under
    3.6).
    H200, flush A/Bs against 4 warps (µs, do_bench's / clean): sparse B=16 × 8 heads (16
    splits, bf16, 128-dim programs: 1 warp) 23.6 / 21.0 → 21.4 / 18.9, float32 partials at 512
    dims (4 warps either way) level (h200-20261203-s32-f2ba160-combine-warps-ab.json); fp8 B=1 ×
    128K × 8 (256 splits, 16-dim programs) 36.6 / 30.0 → 36.2 / 29.7, B=4 × 32K 36.8 / 30.3 →
    35.8 / 29.3, sparse B=4 × 8 (32 splits, 32 dims) 14.3 / 13.3 → 13.7 / 12.6; 2 warps between
    (h200-20261203-s33-0e48876-narrow-warps-ab.json)."""
    return max(1, min(4, block_d * part_bytes // (16 * 32)))


def check_softmax_scale(softmax_scale: object) -> float:
    """``softmax_scale`` as a float (576^-0.5 where None): a finite real number > 0 (numpy and
    0-d torch scalars too, not a string or a bool), else TypeError / ValueError naming it."""
    try:
        if isinstance(softmax_scale, bool | str | bytes):
            raise TypeError
        value = KV_DIM ** -0.5 if softmax_scale is None else float(softmax_scale)
    except (TypeError, ValueError):
        raise TypeError(f"softmax_scale: expected a float, got "
                        f"{type(softmax_scale).__name__} {softmax_scale!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"softmax_scale: expected a finite float > 0, got {softmax_scale!r}")
    return value


def as_cache_rows(kv_cache: torch.Tensor, fmt: KVFormat, page_size: int | None = None) -> torch.Tensor:
    """The cache as uint8 ``[num_pages, page_size, row_bytes]``. Accepts that shape, a
    ``[num_pages, page_size, 1, row_bytes]`` uint8 view (FlashMLA's), or a bf16
    ``[num_pages, page_size(, 1), 576]`` cache for the bf16 format."""
    check_tensor("kv_cache", kv_cache)
    rows = kv_cache
    if rows.dim() == 4 and rows.shape[2] == 1:
        rows = rows.squeeze(2)
    if rows.dtype == torch.bfloat16 and fmt.name == "bf16" and rows.dim() == 3:
        if rows.shape[-1] != KV_DIM:
            raise ValueError(f"kv_cache: expected bf16 [num_pages, page_size, {KV_DIM}], got "
                             f"{list(kv_cache.shape)}")
        rows = rows.view(torch.uint8)
    if rows.dtype in (torch.float8_e4m3fn, torch.int8):
        rows = rows.view(torch.uint8)
    want = f"uint8 [num_pages, page_size, {fmt.row_bytes}] for kv_format {fmt.name}"
    if rows.dtype != torch.uint8 or rows.dim() != 3 or rows.shape[2] != fmt.row_bytes:
        raise ValueError(f"kv_cache: expected {want}, got {kv_cache.dtype} {list(kv_cache.shape)}")
    if page_size is not None and rows.shape[1] != page_size:
        raise ValueError(f"kv_cache: plan has page_size {page_size}, cache pages hold {rows.shape[1]}")
    if rows.stride(2) != 1 or rows.stride(1) != fmt.row_bytes or rows.stride(0) != rows.shape[1] * fmt.row_bytes:
        raise ValueError("kv_cache: expected contiguous pages (one layer's pool, e.g. "
                         "PagedKVCache.layer(i))")
    align = 2 if fmt.name == "bf16" else 4  # fp8 rows are read as 32-bit words (lanes, scales)
    if rows.data_ptr() % align:
        raise ValueError(f"kv_cache: expected a start {align}-byte aligned for {fmt.name} rows, "
                         f"got an address {rows.data_ptr() % align} bytes past that")
    return rows


def check_paged_inputs(block_table: torch.Tensor, cache_seqlens: torch.Tensor, batch: int,
                       page_size: int, num_pages: int, device: torch.device, *,
                       validate: bool) -> None:
    """block_table: int32 [batch, max_pages] (last dim contiguous); cache_seqlens: int32
    [batch]. Dtype/shape checks always; with ``validate`` (a host sync) also: lengths in
    [0, max_pages · page_size], and every block-table entry a length uses inside the pool."""
    check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=device)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected {batch} rows (batch), got {block_table.shape[0]}")
    if block_table.stride(1) != 1:
        raise ValueError("block_table: expected a contiguous last dimension")
    check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, shape=(batch,), device=device,
                 contiguous_last=True)
    if not validate or batch == 0:
        return
    lens = cache_seqlens.cpu()
    cover = block_table.shape[1] * page_size
    if int(lens.min()) < 0 or int(lens.max()) > cover:
        bad = int(lens.min()) if int(lens.min()) < 0 else int(lens.max())
        raise ValueError(
            f"cache_seqlens: expected lengths in [0, {cover}] (block_table has "
            f"{block_table.shape[1]} pages of {page_size}), got {bad}"
        )
    used = (torch.arange(block_table.shape[1])[None, :] * page_size) < lens[:, None]
    entries = block_table.cpu()[used]
    if entries.numel() and (int(entries.min()) < 0 or int(entries.max()) >= num_pages):
        bad = int(entries.min()) if int(entries.min()) < 0 else int(entries.max())
        raise ValueError(
            f"block_table: a page within cache_seqlens points outside the pool [0, {num_pages}): "
            f"{bad}"
        )


# local memory (stack frame + spills) a compiled decode kernel may hold per thread and still
# count as not spilling, 4-byte words: PyTorch Inductor's default ``spill_threshold``. The tuned
# configs hold 0–24 bytes (aligned sm_90 compiles, triton 3.6–3.9); triton 3.8's 32-row fp8
# config at 2 stages, 224 (`fit_shared`)
SPILL_WORDS = 16


def _spills(kernel) -> bool | None:
    """Whether a compiled kernel keeps more than `SPILL_WORDS` words a thread in local memory
    (Triton's ``n_spills``, read when the binary loads: on a GPU); None where not known."""
    try:
        kernel._init_handles()
        return int(kernel.n_spills) > SPILL_WORDS
    except (AttributeError, TypeError):
        return None


class DecodePlan:
    """A dense-decode problem and its split-KV schedule.

    Args:
        batch, num_heads, s_q: problem shape (q is [batch, s_q, num_heads, 576]); s_q 1–4.
        kv_format: ``bf16`` / ``fp8`` / ``fp8_ds_mla`` (or a `KVFormat`).
        page_size: power of two, 1–256.
        cache_seqlens: int32 [batch] lengths the schedule is sized for (read once, on the host),
            or ``max_seqlen``: an int bound instead.
        softmax_scale: defaults to 576^-0.5; pass `MLAConfig.softmax_scale` for a model.
        num_splits / config: overrides of the scheduler and tile configuration (benchmarks).
        causal: with s_q > 1, query i sees the first cache_seqlens − s_q + 1 + i tokens (the
            default, as in MTP / speculative decode); False: every query sees all of them.
        fp8_scores: True takes q · Kᵀ as an FP8 wgmma where the serving SM90 kernel has one
            (the 9–16-row wide forms — fp8 for programs of ≥ `SM90_MMA16_QK8_MIN_TILES`
            tiles, fp8_ds_mla always, head blocks included — and the sparse ≤ 8-row kernel):
            7–9% faster for fp8_ds_mla at 16 heads on the H200, but each score errs by
            ~1.5e-4 of its row's largest logit, ~1.3e-3 where one q element dwarfs the rest
            (float32 accumulation errs by ~1e-6; BENCHMARKS.md, session 25). False never;
            None (the default) as the module's switches say (off).
        batch_invariant: True fixes the schedule and the kernel whatever the batch size, so a
            request's output is bit for bit the same alone or in any batch (vLLM's
            batch-invariant mode): one split a request (``num_splits`` None or 1) and no
            batch-size rule picking the kernel (`SPARSE_SM90_SMALL_BATCH`). The kernel may
            still follow the length bound: such a plan takes ``max_seqlen`` (pass one bound
            for every batch), not ``cache_seqlens``.
        own_outputs: False makes no ``out`` / ``lse`` buffers (each run is then given its
            own): for callers that always pass them — they would otherwise hold
            batch · s_q · heads · 1028 bytes per plan unused (the compat layers' plans, one
            per captured graph size).

    A plan of several splits keeps each split's normalized partial output in a workspace
    sized once (`workspace_bytes`): in bfloat16 on the kernels where halving its traffic
    against float32 measured faster on the H200 (`partials_dtype`: the Gluon kernels — the
    64-row ones while `SM90_ROWS_IN_ORDER` — and the Triton kernel over bf16 rows at ≤ 32 rows
    a program) — one more bf16 rounding of each partial before the LSE-weighted merge (the
    output is bf16 too) — else float32; the LSE float32.
    """

    sparse = False  # fp8mla.sparse.SparsePlan reuses this plan with index lists
    # the kernel checks each entry of its token lists (SPARSE: index lists with −1 / slots
    # outside the pool); False: block tables, or index lists compacted first, which it reads
    # as a table of one-token pages (`fp8mla.sparse.SparsePlan.checks_indices`)
    checks_indices = False

    def __init__(
        self, *, batch: int, num_heads: int, kv_format: str | KVFormat, page_size: int,
        cache_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None, s_q: int = 1,
        softmax_scale: float | None = None, device: str | torch.device = "cuda",
        num_splits: int | None = None, config: DecodeConfig | None = None, causal: bool = True,
        fp8_scores: bool | None = None, batch_invariant: bool = False,
        own_outputs: bool = True,
    ) -> None:
        self.batch = check_int("batch", batch, lo=1)
        if not isinstance(own_outputs, bool):
            raise TypeError(f"own_outputs: expected a bool, got {type(own_outputs).__name__}")
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"batch_invariant: expected a bool, got "
                            f"{type(batch_invariant).__name__}")
        if batch_invariant and num_splits not in (None, 1):
            raise ValueError(f"num_splits: expected None or 1 with batch_invariant (one split "
                             f"a request), got {num_splits}")
        if batch_invariant and cache_seqlens is not None:
            raise ValueError("cache_seqlens: expected None with batch_invariant (the kernel may "
                             "follow the length bound: pass max_seqlen, one bound for every "
                             "batch), got a tensor")
        self.batch_invariant = batch_invariant
        num_splits = 1 if batch_invariant else num_splits
        if not isinstance(causal, bool):
            raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
        if fp8_scores is not None and not isinstance(fp8_scores, bool):
            raise TypeError(f"fp8_scores: expected a bool or None, got "
                            f"{type(fp8_scores).__name__}")
        self.causal = causal
        self.num_heads = check_int("num_heads", num_heads, lo=1, hi=128)
        self.s_q = check_int("s_q", s_q, lo=1, hi=4)
        self.fmt = formats.kv_format(kv_format)
        self.page_size = check_page_size(page_size)
        self.device = torch.device(device)
        self.softmax_scale = check_softmax_scale(softmax_scale)
        if cache_seqlens is not None:
            check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, shape=(batch,))
            if cache_seqlens.is_meta:
                raise ValueError("cache_seqlens: expected lengths to read (on the CPU or a GPU), "
                                 "got a meta tensor")
            lo, max_seqlen = (int(v) for v in cache_seqlens.aminmax())
            if lo < 0:
                raise ValueError(f"cache_seqlens: expected lengths >= 0, got {lo}")
        if max_seqlen is None:
            raise ValueError("cache_seqlens / max_seqlen: expected one of them, got neither")
        check_int("max_seqlen", max_seqlen, lo=0)
        if num_splits is not None:
            check_int("num_splits", num_splits, lo=1, hi=1024)
        self.target: Target = target_for(self.device)
        self.config = config or decode_config(self.target.cc, self.fmt.name, num_heads, s_q,
                                              self.sparse)
        self._config_fixed = config is not None  # kept as given (`_fit_shared`)
        # the longest request (sparse: list width) the plan was made for: the ≤ 16-row kernels
        # look up tile 0's page (entries) for it while the request's own length loads
        # (`decode_sm90_mma8._ring_start`; ≤ 2^30: the guessed chunk starts stay inside int32)
        self._len_hint = min(max_seqlen, 2**30)
        self._splits_asked = num_splits  # (None: the scheduler's)
        schedule = None if config is not None else self._mma8_schedule(max_seqlen, num_splits)
        self.mma8 = schedule is not None
        # heads a program of the ≤ 16-row kernel holds where it runs in head blocks (else 0),
        # fixed with the grid; the config becomes a 16-row program's (the Triton kernel serves
        # a pool that is not 16-byte aligned)
        self._block_heads = self._head_block() if self.mma8 else 0
        if self._block_heads:
            self.config = decode_config(self.target.cc, self.fmt.name, self._block_heads,
                                        self.s_q, self.sparse)
        self.sm90 = self.mma8 or (config is None and self._sm90_serves())
        # the 64-row form ("tma" / "gather", `_sm90_form`), fixed with the plan like the rest
        self.sm90_form = self._sm90_form() if self.sm90 and not self.mma8 else None
        # every query's heads in one 64-row program (`_packs`)
        self.packed = self.sm90_form is not None and self._packs()
        self.head_blocks = triton.cdiv(num_heads, self.config.heads_per_block)
        # programs of one request's split: its head blocks (the Triton and ≤ 16-row kernels
        # hold every query row of their heads), but one query's 64 heads a program on the
        # 64-row Gluon kernels — or one program, packed (the Triton config's blocks still
        # serve a misaligned pool)
        self._query_blocks = (1 if self.packed else triton.cdiv(num_heads, 64) * s_q
                              if self.sm90 and not self.mma8 else self.head_blocks)
        # whole tiles by tensor-memory copies: dense, tiles inside pages
        self.tma = self.config.tma and not self.sparse and self.page_size >= self.config.block_n
        self._descs = (None, None)  # (pool key, TMA descriptors) of the last pool run on
        # the plan's own outputs (None without ``own_outputs``: each run is given them)
        self.out = self.lse = None
        if own_outputs:
            self.out = torch.empty(batch, s_q, num_heads, LATENT_DIM, dtype=torch.bfloat16,
                                   device=self.device)
            self.lse = torch.empty(batch, s_q, num_heads, dtype=torch.float32,
                                   device=self.device)
        # (registers a thread, shared bytes a program) of the Triton kernel's compile the plan
        # launches, where it compiled one to size the grid (`_programs_per_sm`); else None
        self.compiled_resources = None
        # programs of this kernel one SM holds at once (from the compiled kernel's registers
        # and shared memory; 2 when interpreted; the Gluon SM90 kernels: one, for their 225 KB
        # of shared memory, but the ≤ 16-row ones by their rows and ring depth, fixed here for
        # the plan: `_mma8_schedule`)
        self.mma_rows, self.ring_stages, self.programs_per_sm = (
            schedule if self.mma8 else (0, 0, 1 if self.sm90 else self._programs_per_sm()))
        self.num_splits = (num_splits if num_splits is not None  # checked above
                           else choose_num_splits(batch, self._query_blocks, max_seqlen,
                                                  self.target.num_sms * self.programs_per_sm,
                                                  self._tile_tokens()))
        # the ≤ 16-row kernel's first product as FP8 wgmma (`_qk8`)
        self.qk8 = self.mma8 and self._qk8(max_seqlen, fp8_scores)
        # max over the row of the scaled scores (FlashMLA's max_logits), −inf when none
        self.max_logits = torch.empty(batch, s_q, num_heads, dtype=torch.float32,
                                      device=self.device)
        if self.num_splits > 1:
            self.part_out = torch.empty(batch, self.num_splits, s_q, num_heads, LATENT_DIM,
                                        dtype=partials_dtype(self.num_splits, self.kernel,
                                                             self.fmt.name, self.block_rows),
                                        device=self.device)
            self.part_lse = torch.empty(batch, self.num_splits, s_q, num_heads,
                                        dtype=torch.float32, device=self.device)
            self.part_max = torch.empty_like(self.part_lse)
        else:
            self.part_out = self.part_lse = self.part_max = self.max_logits  # placeholders
        self._combine_launch = self._combine_shape() if self.num_splits > 1 else None
        self._unit_scale = torch.ones(1, dtype=torch.float32, device=self.device)
        # debug: int64 [head_blocks × batch × num_splits, 12] on the plan's device that the
        # dense fp8 ≤ 16-row kernel and the sparse ≤ 8-row one fill with each program's timeline
        # when set before a run (or a graph's capture; `benchmarks/timeline.py`); other kernels
        # ignore it. None: no stamps
        self.timeline: torch.Tensor | None = None

    @property
    def kernel(self) -> str:
        """The kernel serving this plan (on a pool whose rows are 16-byte aligned): "mma8"
        (`decode_sm90_mma8`, its fp8_ds_mla and sparse forms), "mma16" (the wide forms, fp8
        and fp8_ds_mla), "sm90" (`decode_sm90`) or "triton" (`_mla_decode_kernel`)."""
        if self.mma8:
            return "mma8" if self.mma_rows == 8 else "mma16"
        return "sm90" if self.sm90 else "triton"

    @property
    def workspace_bytes(self) -> int:
        """Bytes of split partials (independent of the pool and of the lengths)."""
        if self.num_splits == 1:
            return 0
        return (self.part_out.numel() * self.part_out.element_size()
                + (self.part_lse.numel() + self.part_max.numel()) * 4)

    def run(
        self, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        cache_seqlens: torch.Tensor, *, fp8_scale: torch.Tensor | None = None,
        check: bool = True, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
        empty_lse: float = float("-inf"),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend. Graph-safe with ``check=False``.

        q: [batch, s_q, num_heads, 576] bfloat16 (last dim contiguous).
        kv_cache: one layer's pool, uint8 [num_pages, page_size, row_bytes] (see
            `as_cache_rows` for accepted views).
        block_table: int32 [batch, max_pages]; cache_seqlens: int32 [batch].
        fp8_scale: float32 [1], the ``fp8`` format's per-tensor scale (default 1; other formats
            ignore it).
        check: validate lengths and block-table entries on the host first (syncs).
        With FP8MLA_CHECK=1 (fp8mla.numerics) inputs and outputs are also checked for NaN/Inf.
        out / lse: where to write instead of the plan's buffers — bfloat16
            [batch, s_q, num_heads, 512] (last dim contiguous) / float32 [batch, s_q, num_heads],
            any strides (e.g. a transposed view of FlashMLA's [batch, heads, s_q] layout).
        empty_lse: the lse of a row with nothing to attend (−inf; FlashMLA returns +inf).
        Returns (out bfloat16 [batch, s_q, num_heads, 512], lse float32 [batch, s_q, num_heads]):
        ``out`` / ``lse`` when given, else the plan's own buffers (overwritten by the next run).
        A request of length 0 gives out 0 and lse ``empty_lse``.
        """
        check_tensor("q", q, dtype=torch.bfloat16, device=self.device, contiguous_last=True)
        want = (self.batch, self.s_q, self.num_heads, KV_DIM)
        if tuple(q.shape) != want:
            raise ValueError(
                f"q: plan was built for [batch, s_q, num_heads, 576] = {list(want)}, got "
                f"{list(q.shape)}"
            )
        rows = as_cache_rows(kv_cache, self.fmt, self.page_size)
        if not same_device(rows.device, self.device):
            raise ValueError(f"kv_cache: expected device {self.device}, got {rows.device}")
        check_paged_inputs(block_table, cache_seqlens, self.batch, self.page_size, rows.shape[0],
                           self.device, validate=check)
        check_fp8_scale(fp8_scale, self.device, validate=check and self.fmt.name == "fp8")
        scale = fp8_scale if fp8_scale is not None and self.fmt.name == "fp8" else self._unit_scale
        self._check_timeline()
        outputs = self._outputs(out, lse, empty_lse)
        if not numerics.enabled():
            return self._launch(q, rows, block_table, cache_seqlens, scale, *outputs)
        slots = []
        for b, n in enumerate(cache_seqlens.tolist()):
            pos = torch.arange(n, device=block_table.device)
            slots.append(block_table[b, pos // self.page_size].long() * self.page_size
                         + pos % self.page_size)
        numerics.check_attention_inputs("dense_decode", q, rows.view(-1, self.fmt.row_bytes),
                                        self.fmt, slots, scale)
        out, lse = self._launch(q, rows, block_table, cache_seqlens, scale, *outputs)
        numerics.check_attention_outputs("dense_decode", out, lse, empty_lse)
        return out, lse

    def _outputs(self, out, lse, empty_lse, per_query=False):
        """Checked output tensors (the plan's buffers where None) and the empty-row lse, shaped
        [batch, s_q, heads, ..]; ``per_query``: given as [queries, heads, ..] (sparse)."""
        shape = (self.batch, self.num_heads) if per_query else (self.batch, self.s_q,
                                                                   self.num_heads)
        if (out is None or lse is None) and self.out is None:
            raise ValueError(f"{'out' if out is None else 'lse'}: expected a tensor (the plan "
                             f"was made with own_outputs=False: each run is given its "
                             f"outputs), got None")
        if out is None:
            out = self.out
        else:
            check_tensor("out", out, dtype=torch.bfloat16, shape=(*shape, LATENT_DIM),
                         device=self.device, contiguous_last=True)
            out = out.unsqueeze(1) if per_query else out
        if lse is None:
            lse = self.lse
        else:
            check_tensor("lse", lse, dtype=torch.float32, shape=shape, device=self.device)
            lse = lse.unsqueeze(1) if per_query else lse
        if empty_lse != float("-inf") and empty_lse != float("inf"):
            raise ValueError(f"empty_lse: expected -inf or +inf, got {empty_lse!r}")
        return out, lse, float(empty_lse)

    def _kernel_args(self, q, rows, block_table, cache_seqlens, kv_scale, direct, out, lse,
                     empty_lse):
        """Positional arguments and compile-time parameters of `_mla_decode_kernel`."""
        cfg, t = self.config, self.target
        flat = rows.view(-1, self.fmt.row_bytes)
        u32 = flat.view(torch.int32) if self.fmt.is_fp8 else flat
        f32 = flat.view(torch.float32) if self.fmt.name == "fp8_ds_mla" else u32
        bf16 = flat.view(torch.bfloat16) if self.fmt.name != "fp8" else u32
        tma = self.tma and flat.data_ptr() % 16 == 0
        descs = (None, None, None)
        if tma:  # built once per pool (eager launches still encode them: ~µs of host time)
            key = (flat.data_ptr(), flat.shape[0])
            if self._descs[0] != key:
                self._descs = (key, self._descriptors(u32, bf16, f32))
            descs = self._descs[1]
        args = (
            q, u32, bf16, f32, kv_scale, *descs, block_table, cache_seqlens,
            out, lse, self.max_logits, self.part_out, self.part_lse, self.part_max,
            *q.stride()[:3], block_table.stride(0), *out.stride()[:3], *lse.stride(),
            self.softmax_scale, empty_lse, self.num_heads, self.num_splits,
            self.page_size.bit_length() - 1, flat.shape[0],
            min(block_table.shape[1] * self.page_size, 2**31 - 1),
        )
        meta = dict(
            FORMAT=_FORMAT_IDS[self.fmt.name], HW_FP8=t.hw_fp8, DOT_F32=t.interpreted,
            S_Q=self.s_q, S_Q_P2=1 << (self.s_q - 1).bit_length(),
            HEADS=cfg.heads_per_block, BLOCK_N=cfg.block_n, DIRECT=direct,
            ROW_WORDS=self.fmt.row_bytes // 4, SW_SCALE=1.0 if t.hw_fp8 else SW_DEQUANT_SCALE,
            WORDS_2D=cfg.words_2d, SPARSE=self.checks_indices, CAUSAL=self.causal,
            FOLD_SCALES=cfg.fold_scales, TMA=tma,
            CARRY=slots_ahead(cfg.num_stages, tma, cfg.lookahead), LAZY=cfg.lazy_rescale,
            LATE_SUM=cfg.late_sum, PDL=self._pdl_signal(direct), num_warps=cfg.num_warps,
            num_stages=cfg.tma_stages if tma else cfg.num_stages,
        )
        if cfg.maxnreg is not None:
            meta["maxnreg"] = cfg.maxnreg
        return args, meta

    def _descriptors(self, u32, bf16, f32):
        """Tensor-memory-copy descriptors over the pool's rows for `_tma_tile` / `_fold_tile`:
        (latent, rope, scales or None)."""
        n, name = self.config.block_n, self.fmt.name
        if name == "bf16":
            return (TensorDescriptor.from_tensor(bf16, [n, 128]),
                    TensorDescriptor.from_tensor(bf16, [n, 64]), None)
        if name == "fp8":
            return (TensorDescriptor.from_tensor(u32, [n, 128]),
                    TensorDescriptor.from_tensor(u32, [n, 16]), None)
        words = self.fmt.row_bytes // 4
        if self.folds_scales:  # one [n, 32]-word box per 128-dim scale tile
            lat = TensorDescriptor.from_tensor(u32, [n, 32])
        else:  # rows as [4 scale tiles, 32 words]
            lat = TensorDescriptor(u32, [u32.shape[0], 4, 32], [words, 32, 1], [n, 4, 32])
        return (lat, TensorDescriptor.from_tensor(bf16, [n, 64]),
                TensorDescriptor.from_tensor(f32, [n, 4]))

    @property
    def block_rows(self) -> int:
        """Rows a program holds: pow2(s_q) × the config's heads a program."""
        return (1 << (self.s_q - 1).bit_length()) * self.config.heads_per_block

    @property
    def folds_scales(self) -> bool:
        """fp8_ds_mla scales folded into the scores and P (`fp8mla.runtime.folds_scales`)."""
        return folds_scales(self.fmt.name, self.block_rows, self.config.fold_scales)

    def _programs_per_sm(self) -> int:
        """Compile the split kernel for this plan (with stand-in tensors), fitting its config to
        the GPU's shared memory (`_fit_shared`), and count how many of its programs one SM holds
        at once; 2 when interpreted or when Triton does not say."""
        if self.target.interpreted:
            return 2
        try:
            kernel = self._fit_shared()
            kernel._init_handles()  # loads the binary: sets n_regs (Triton 3.6–3.9)
            regs, shared = int(kernel.n_regs), int(kernel.metadata.shared)
        except (AttributeError, TypeError):
            return 2
        self.compiled_resources = (regs, shared)
        return resident_programs(self.target.cc, self.config.num_warps, regs, shared)

    def _fit_shared(self):
        """The split kernel compiled for this plan with stand-in tensors, its config fitted to
        the GPU's shared memory on the way (`fp8mla.runtime.fit_shared`: fewer stages, then
        smaller tiles, where the Triton in use stages more through shared memory than the
        configs were sized for; a config passed to the plan is kept or refused). Returns the
        compiled kernel (sets ``self.config``)."""
        # stand-ins with the real tensors' dtypes and stride classes (Triton specializes on
        # divisibility by 16), but tiny: nothing is launched
        dev = self.device
        q = torch.empty(1, 1, 1, KV_DIM, dtype=torch.bfloat16, device=dev)
        rows = torch.empty(16, self.fmt.row_bytes, dtype=torch.uint8, device=dev)
        table = torch.empty(self.batch, 16, dtype=torch.int32, device=dev)
        lens = torch.empty(self.batch, dtype=torch.int32, device=dev)
        # the outputs' shapes (their strides specialize the compile), held for it alone
        out = self.out if self.out is not None else torch.empty(
            self.batch, self.s_q, self.num_heads, LATENT_DIM, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(self.batch, self.s_q, self.num_heads, dtype=torch.float32, device=dev)
        self.max_logits = self.part_out = self.part_lse = self.part_max = lse
        self.num_splits = 2  # a stand-in; the schedule is chosen from this compile
        # (the partials' store type is part of the kernel compiled)
        self.part_out = torch.empty(1, dtype=partials_dtype(
            self.num_splits, "triton", self.fmt.name, self.block_rows), device=dev)

        def compile_config(cfg):
            self.config, self._descs = cfg, (None, None)  # descriptors: this config's boxes
            args, meta = self._kernel_args(q, rows, table, lens, lse, False, out, lse,
                                           float("-inf"))
            return _mla_decode_kernel.warmup(*args, grid=(1,), **meta, **OPTIONS)

        self.config, kernel = fit_shared(self.config, self.tma, compile_config,
                                         self._shared_limit(), fixed=self._config_fixed,
                                         spills=_spills)
        self._descs = (None, None)  # the stand-in pool's
        return kernel

    def _shared_limit(self) -> int:
        """Shared memory a program may use on the plan's GPU, bytes: the limit Triton's launcher
        enforces there (its driver's ``max_shared_mem``, the device's opt-in maximum), else the
        target's (`block_shared_limit`: 99 KB for a GPU the table does not know)."""
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else (
                torch.cuda.current_device())
            try:
                return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
            except (AttributeError, KeyError, TypeError):
                pass
        return block_shared_limit(self.target.cc)

    @property
    def _pdl(self) -> bool:
        """The split combine launched as a programmatic dependent (`PDL`): SM90 only for now
        — griddepcontrol compiles for SM100/SM120 too, but nothing has run there (and graph
        capture of such launches has been reported failing on SM120)."""
        return PDL and self.target.cc == 90 and not self.target.interpreted

    def _pdl_signal(self, direct: bool) -> bool:
        """The decode kernel's `PDL`: whether it signals a combine that follows as a
        programmatic dependent (`PDL_SIGNAL`)."""
        return PDL_SIGNAL and self._pdl and not direct

    def _sm90_serves(self) -> bool:
        """Whether a 64-row Gluon SM90 kernel serves this plan (`_sm90_form`): 64-head
        programs (dense: more than 32 heads, s_q 2–4 a program a query, `SM90_MTP`, or 33–64
        query rows in one program, `_packs`; sparse:
        from `SPARSE_SM90_MIN_HEADS` heads, and fp8_ds_mla lists of 9–16 heads for at most
        `SPARSE_SM90_SMALL_BATCH` queries unless ``batch_invariant``), a GPU of compute
        capability 9.0 and a Triton with Gluon."""
        if self.target.interpreted or self.target.cc != 90:
            return False
        if self.s_q > 1 and not SM90_MTP:
            return False
        if self._sm90_form() is None:
            return False
        from fp8mla.kernels import decode_sm90  # imports Gluon: only where it may serve

        if self.sparse:  # the heads `_sm90_form` admits: part-empty 64-head programs below 64
            return decode_sm90.AVAILABLE
        # 64-head programs: the heads a program of s_q 1 takes (queries are programs here),
        # or every query's heads in one (`_packs`)
        heads = decode_config(self.target.cc, self.fmt.name, self.num_heads, 1).heads_per_block
        return decode_sm90.AVAILABLE and (heads == decode_sm90.HEADS or self._packs())

    def _packs(self) -> bool:
        """Whether a 64-row Gluon program holds every query's heads of a request (dense, s_q
        2–4, 33–64 query rows: `SM90_PACKED`) where the 64-row kernels serve this plan."""
        return (SM90_PACKED and not self.sparse and self.s_q > 1
                and 32 < self.s_q * self.num_heads <= 64)

    def _sm90_form(self) -> str | None:
        """Which 64-row Gluon kernel may serve this plan (`_sm90_serves` says whether one
        does): "tma" — `decode_sm90._mla_decode_sm90_kernel`, dense fp8 rows in pages of ≥ 64
        tokens (`SM90_GLUON`); "gather" — `decode_sm90._mla_sparse_sm90_kernel`, index lists
        of fp8_ds_mla rows from `SPARSE_SM90_MIN_HEADS` heads (`SPARSE_SM90_GLUON`) or of fp8
        rows (`SM90_GATHER_FP8` too) — and of fp8_ds_mla rows at 9–16 heads for at most
        `SPARSE_SM90_SMALL_BATCH` queries unless ``batch_invariant`` —, dense fp8_ds_mla rows
        through the block table (`SM90_DS_PAGED`), dense fp8 rows in pages shorter than a
        tile (`SM90_GATHER_FP8`); None: neither."""
        fmt = self.fmt.name
        if self.sparse:
            lists = fmt == "fp8_ds_mla" or (fmt == "fp8" and SM90_GATHER_FP8)
            small = (fmt == "fp8_ds_mla" and self.num_heads > 8 and not self.batch_invariant
                     and self.batch <= SPARSE_SM90_SMALL_BATCH)
            return ("gather" if SPARSE_SM90_GLUON and lists
                    and (self.num_heads >= SPARSE_SM90_MIN_HEADS or small) else None)
        whole_tiles = self.page_size >= 64  # decode_sm90.BLOCK_N: tiles inside pages
        if fmt == "fp8" and whole_tiles:
            return "tma" if SM90_GLUON else None
        if (fmt == "fp8_ds_mla" and SM90_DS_PAGED) or (fmt == "fp8" and SM90_GATHER_FP8):
            return "gather"
        return None

    def _tile_tokens(self) -> int:
        """Tokens per tile of the kernel that serves this plan (whole tiles per split): 64 on
        the Gluon kernels (the config's are the Triton kernel's: 32 for sparse plans of 17–32
        heads, which would split a short batch into twice the programs, half of them empty)."""
        if self.mma8:
            from fp8mla.kernels import decode_sm90_mma8 as k8

            return k8.BLOCK_N
        if self.sm90:
            return 64  # decode_sm90.BLOCK_N
        return self.config.block_n

    def _head_block(self) -> int:
        """Heads per program where a wide form serves this plan in head blocks — fp8_ds_mla's
        (`SM90_MMA16_DS_HEAD_BLOCKS`) or fp8's (`SM90_MMA16_FP8_HEAD_BLOCKS`): dense, 17–32
        query rows, s_q 1, 2 or 4 and heads a multiple of 16 // s_q —, else 0."""
        heads = 16 // self.s_q
        if (self.sparse or 16 % self.s_q or not 16 < self.s_q * self.num_heads <= 32
                or self.num_heads % heads):
            return 0
        if self.fmt.name == "fp8_ds_mla":
            return heads if SM90_MMA16_DS_HEAD_BLOCKS and SM90_MMA16_DS else 0
        if self.fmt.name != "fp8" or not SM90_MMA16:
            return 0
        if SM90_MMA16_FP8_HEAD_BLOCKS is not None:
            return heads if SM90_MMA16_FP8_HEAD_BLOCKS else 0
        if triton_minor(triton.__version__) == (3, 8):
            return heads
        from fp8mla.kernels import decode_sm90_mma8 as k8

        rows = k8.WIDE_ROWS
        splits = self._splits_asked or choose_num_splits(
            self.batch, self.num_heads // heads, self._len_hint,
            self.target.num_sms * k8.programs_per_sm(rows, mma8_stages(rows)), k8.BLOCK_N)
        return heads if splits >= SM90_MMA16_FP8_HEAD_BLOCKS_MIN_SPLITS else 0

    def _mma_schedule(self) -> tuple[int, int, int]:
        """(program rows, ring stages, programs per SM) of the ≤ 16-row Gluon kernel for this
        plan's format and s_q × heads (per head block: `_head_block`): sparse fp8_ds_mla (8
        rows, `SPARSE_SM90_MMA8_STAGES`), dense fp8_ds_mla (8 or 16 rows, `SM90_MMA8_DS_STAGES`)
        or dense fp8 (`mma8_stages`)."""
        from fp8mla.kernels import decode_sm90_mma8 as k8

        if self.sparse:
            from fp8mla.kernels import decode_sm90_mma8_sparse as km

            return k8.ROWS, SPARSE_SM90_MMA8_STAGES, km.programs_per_sm(SPARSE_SM90_MMA8_STAGES)
        rows = k8.rows_for(self.s_q * (self._head_block() or self.num_heads))
        if self.fmt.name == "fp8_ds_mla":
            from fp8mla.kernels import decode_sm90_mma8_ds as kd

            return rows, SM90_MMA8_DS_STAGES, kd.programs_per_sm(SM90_MMA8_DS_STAGES, rows)
        stages = mma8_stages(rows)
        return rows, stages, k8.programs_per_sm(rows, stages)

    def _program_tiles(self, max_seqlen: int, num_splits: int | None, per_sm: int) -> int:
        """64-token tiles of the longest request's programs under ``num_splits`` (or the
        scheduler's: one program for all heads or, in head blocks, one a block (`_head_block`);
        ``per_sm`` programs an SM)."""
        from fp8mla.kernels.decode_sm90_mma8 import BLOCK_N

        tiles = triton.cdiv(max(max_seqlen, 1), BLOCK_N)
        blocks = self.num_heads // (self._head_block() or self.num_heads)
        splits = num_splits or choose_num_splits(self.batch, blocks, max_seqlen,
                                                 self.target.num_sms * per_sm, BLOCK_N)
        return triton.cdiv(tiles, splits)

    def _mma8_schedule(self, max_seqlen: int,
                       num_splits: int | None) -> tuple[int, int, int] | None:
        """`_mma_schedule` where a Gluon SM90 kernel of ≤ 16-row programs (`decode_sm90_mma8`
        and its fp8_ds_mla and sparse forms; `plan.mma8` covers all of them) serves this plan,
        else None. It serves dense fp8 rows in pages of ≥ 64 tokens with s_q × heads ≤ 8
        (`SM90_MMA8`), dense fp8_ds_mla rows the same (`SM90_MMA8_DS`), either with 9–16 where
        the schedule (``num_splits``, the scheduler's where None) gives programs enough tiles
        (`mma16_min_tiles`, `SM90_MMA16_DS_MIN_TILES`; switches `SM90_MMA16`,
        `SM90_MMA16_DS`) — dense plans of 17–32 rows too, in head blocks of 16 rows
        (`_head_block`) —, or sparse fp8_ds_mla rows over index lists with ≤ 8 heads
        (`SPARSE_SM90_MMA8`); one program for all heads (or a head block), a GPU of compute
        capability 9.0 and a Triton with Gluon."""
        if self.target.interpreted or self.target.cc != 90:
            return None
        if self.sparse:
            if not (SPARSE_SM90_MMA8 and self.fmt.name == "fp8_ds_mla"):
                return None
        elif not ((SM90_MMA8 and self.fmt.name == "fp8")
                  or (SM90_MMA8_DS and self.fmt.name == "fp8_ds_mla")):
            return None
        from fp8mla.kernels import decode_sm90_mma8 as k8  # imports Gluon

        rows = self.s_q * (self._head_block() or self.num_heads)
        if rows > k8.ROWS:  # the wide form: dense
            wide = ((SM90_MMA16 and self.fmt.name == "fp8")
                    or (SM90_MMA16_DS and self.fmt.name == "fp8_ds_mla"))
            if not (wide and not self.sparse and rows <= k8.WIDE_ROWS):
                return None
        if not (k8.AVAILABLE and (self._head_block()
                                  or self.config.heads_per_block >= self.num_heads)
                and (self.sparse or self.page_size >= k8.BLOCK_N)):
            return None
        schedule = self._mma_schedule()
        if rows > k8.ROWS:  # the wide form: programs of enough tiles
            least = mma16_min_tiles() if self.fmt.name == "fp8" else SM90_MMA16_DS_MIN_TILES
            if self._program_tiles(max_seqlen, num_splits, schedule[2]) < least:
                return None
        return schedule

    def _check_timeline(self) -> None:
        """`timeline`, where set: int64 [head_blocks × batch × num_splits, 12] on the plan's
        device."""
        if self.timeline is not None:
            check_tensor("timeline", self.timeline, dtype=torch.int64, device=self.device,
                         shape=(self.head_blocks * self.batch * self.num_splits, 12))

    def _qk8(self, max_seqlen: int, fp8_scores: bool | None) -> bool:
        """Whether the ≤ 16-row kernel serving this plan takes its first product as FP8 wgmma:
        the fp8 wide form for programs of ≥ `SM90_MMA16_QK8_MIN_TILES` tiles (`SM90_MMA16_QK8`),
        the fp8_ds_mla wide form (`SM90_MMA8_DS_QK8`), the sparse kernel
        (`SPARSE_SM90_MMA8_QK8`) — each switch overridden by ``fp8_scores`` where given."""
        def wanted(switch: bool) -> bool:
            return switch if fp8_scores is None else fp8_scores

        if self.sparse:
            return wanted(SPARSE_SM90_MMA8_QK8)
        if self.mma_rows != 16:
            return False
        if self.fmt.name == "fp8_ds_mla":
            return wanted(SM90_MMA8_DS_QK8)
        tiles = self._program_tiles(max_seqlen, self.num_splits, self.programs_per_sm)
        return wanted(SM90_MMA16_QK8) and tiles >= SM90_MMA16_QK8_MIN_TILES

    def _launch_sm90(self, q, rows, block_table, cache_seqlens, kv_scale, out, lse, empty_lse,
                     direct):
        """`fp8mla.kernels.decode_sm90` over the plan's grid; descriptors built once per pool."""
        from fp8mla.kernels import decode_sm90

        flat = rows.view(-1, self.fmt.row_bytes)
        grid = (self.batch, self.num_splits, self.head_blocks)
        if self.sparse and self.mma8:  # block_table: the index lists; cache_seqlens: their
            from fp8mla.kernels import decode_sm90_mma8_sparse as km  # lengths

            fast(km._mla_sparse_mma8_kernel)[grid](
                q, flat, flat.view(torch.float32), block_table, cache_seqlens, out, lse,
                self.max_logits, self.part_out, self.part_lse, self.part_max, q.stride(0),
                q.stride(2), block_table.stride(0), out.stride(0), out.stride(2),
                lse.stride(0), lse.stride(2), self.softmax_scale, empty_lse, self.num_heads,
                self.num_splits, min(block_table.shape[1], 2**31 - 1), flat.shape[0],
                self._len_hint, DIRECT=direct, HEADS=self.num_heads, NS=self.ring_stages,
                QK8=self.qk8, PDL=self._pdl_signal(direct), stamp_ptr=self.timeline,
                TIMELINE=self.timeline is not None, num_warps=km.NUM_WARPS)
            return
        # the 64-row kernels: one query's 64 heads a program (grid axis 2: head blocks × s_q),
        # or every query's (packed: one)
        grid64 = (self.batch, self.num_splits, self._query_blocks)
        queries = dict(S_Q=self.s_q, CAUSAL=self.causal, PACK=self.packed)
        if self.sm90_form == "gather":  # index lists, or (PAGED) the block table's pages
            fast(decode_sm90._mla_sparse_sm90_kernel)[grid64](
                q, flat, flat.view(torch.float32), block_table, cache_seqlens, kv_scale, out,
                lse, self.max_logits, self.part_out, self.part_lse, self.part_max,
                *q.stride()[:3], block_table.stride(0), *out.stride()[:3], *lse.stride(),
                self.softmax_scale, empty_lse, self.num_heads, self.num_splits,
                min(block_table.shape[1] * self.page_size, 2**31 - 1), flat.shape[0],
                self.page_size.bit_length() - 1, DIRECT=direct, HEADS=decode_sm90.HEADS,
                BN=decode_sm90.BLOCK_N, PDL=self._pdl_signal(direct),
                IN_ORDER=SM90_ROWS_IN_ORDER, PAGED=not self.sparse,
                DS=self.fmt.name == "fp8_ds_mla", num_warps=decode_sm90.NUM_WARPS, **queries)
            return
        key = (flat.data_ptr(), flat.shape[0])
        if self._descs[0] != key:  # built once per pool, as the Triton kernel's
            if self.mma8 and self.fmt.name == "fp8_ds_mla":
                from fp8mla.kernels import decode_sm90_mma8_ds as kd

                self._descs = (key, kd.descriptors(flat))
            elif self.mma8:
                from fp8mla.kernels import decode_sm90_mma8 as k8

                self._descs = (key, k8.descriptors(flat))
            else:
                self._descs = (key, decode_sm90.descriptors(flat))
        lat, rope = self._descs[1]
        if self.mma8 and self.fmt.name == "fp8_ds_mla":
            from fp8mla.kernels import decode_sm90_mma8_ds as kd

            fast(kd._mla_decode_mma8_ds_kernel)[grid](
                q, lat, rope, flat.view(torch.float32), block_table, cache_seqlens, out, lse,
                self.max_logits, self.part_out, self.part_lse, self.part_max, *q.stride()[:3],
                block_table.stride(0), *out.stride()[:3], *lse.stride(), self.softmax_scale,
                empty_lse, self.num_heads, self.num_splits, self.page_size.bit_length() - 1,
                min(block_table.shape[1] * self.page_size, 2**31 - 1), flat.shape[0],
                self._len_hint, DIRECT=direct, S_Q=self.s_q,
                HEADS=self._block_heads or self.num_heads,
                CAUSAL=self.causal, NS=self.ring_stages, R=self.mma_rows, QK8=self.qk8,
                PDL=self._pdl_signal(direct), num_warps=kd.NUM_WARPS)
            return
        if self.mma8:  # the dense fp8 ≤ 16-row kernels
            from fp8mla.kernels import decode_sm90_mma8 as k8

            fast(k8._mla_decode_mma8_kernel)[grid](
                q, lat, rope, block_table, cache_seqlens, kv_scale, out, lse, self.max_logits,
                self.part_out, self.part_lse, self.part_max, *q.stride()[:3],
                block_table.stride(0), *out.stride()[:3], *lse.stride(), self.softmax_scale,
                empty_lse, self.num_heads, self.num_splits, self.page_size.bit_length() - 1,
                min(block_table.shape[1] * self.page_size, 2**31 - 1), self._len_hint,
                DIRECT=direct, S_Q=self.s_q, HEADS=self._block_heads or self.num_heads,
                CAUSAL=self.causal, R=self.mma_rows, NS=self.ring_stages,
                stamp_ptr=self.timeline,
                TIMELINE=self.timeline is not None, QK8=self.qk8,
                PDL=self._pdl_signal(direct) and self.mma_rows == k8.ROWS,
                num_warps=k8.NUM_WARPS)
            return
        fast(decode_sm90._mla_decode_sm90_kernel)[grid64](
            q, lat, rope, block_table, cache_seqlens, kv_scale, out, lse, self.max_logits,
            self.part_out, self.part_lse, self.part_max, *q.stride()[:3],
            block_table.stride(0), *out.stride()[:3], *lse.stride(), self.softmax_scale,
            empty_lse, self.num_heads, self.num_splits, self.page_size.bit_length() - 1,
            min(block_table.shape[1] * self.page_size, 2**31 - 1),
            DIRECT=direct, HEADS=decode_sm90.HEADS, BN=decode_sm90.BLOCK_N,
            PDL=self._pdl_signal(direct), IN_ORDER=SM90_ROWS_IN_ORDER,
            num_warps=decode_sm90.NUM_WARPS, **queries)

    def _launch(self, q, rows, block_table, cache_seqlens, kv_scale, out=None, lse=None,
                empty_lse=float("-inf")):
        """Launch without checks. kv_scale: float32 [1] multiplying every cache value (bf16 and
        fp8 formats; the fp8 format's scale, or the scale of an fp8 pool cast to bf16). For a
        sparse plan, block_table is the [queries, topk] index list and cache_seqlens the
        per-query topk_length. out / lse / empty_lse: as in `run` (the plan's buffers where
        None)."""
        out = self.out if out is None else out
        lse = self.lse if lse is None else lse
        direct = self.num_splits == 1
        # (a dense pool not 16-byte aligned cannot be described for TMA nor copied 16 bytes at
        # a time: the Triton kernel, which gathers such a pool, serves that call; a sparse plan
        # on the Gluon kernels has no such fallback — its lists are not compacted — and refuses)
        misaligned = rows.data_ptr() % 16
        if self.sm90 and self.sparse and misaligned:
            raise ValueError(f"kv_cache: expected a pool whose first row is 16-byte aligned "
                             f"(SM90's Gluon sparse kernels copy rows 16 bytes at a time), got "
                             f"one at address ≡ {misaligned} (mod 16)")
        if self.sm90 and not misaligned:
            self._launch_sm90(q, rows, block_table, cache_seqlens, kv_scale, out, lse,
                              empty_lse, direct)
        else:
            args, meta = self._kernel_args(q, rows, block_table, cache_seqlens, kv_scale,
                                           direct, out, lse, empty_lse)
            fast(_mla_decode_kernel)[(self.batch, self.num_splits, self.head_blocks)](
                *args, **meta)
        if not direct:
            self._combine(out, lse, empty_lse)
        return out, lse

    def _combine_shape(self) -> tuple[tuple[int, int, int], int, int, int]:
        """The split combine's (grid, dims a program, splits a step, warps) for this plan,
        fixed with it (`combine_blocks`, `combine_warps`; computed once: host time a call)."""
        block_d, block_s = combine_blocks(self.batch * self.s_q * self.num_heads,
                                          self.num_splits, self.target.num_sms)
        grid = (self.batch, self.s_q, self.num_heads * LATENT_DIM // block_d)
        return grid, block_d, block_s, combine_warps(block_d, self.part_out.element_size())

    def _combine(self, out, lse, empty_lse):
        """Merge the split workspace (part_out / part_lse / part_max) into out / lse."""
        grid, block_d, block_s, warps = self._combine_launch
        pdl = dict(PDL=True, launch_pdl=True) if self._pdl else {}
        fast(_combine_splits_kernel)[grid](
            self.part_out, self.part_lse, self.part_max, out, lse, self.max_logits,
            *out.stride()[:3], *lse.stride(), empty_lse, self.num_splits, self.num_heads,
            S_Q=self.s_q, DIM=LATENT_DIM, BLOCK_D=block_d, BLOCK_S=block_s,
            num_warps=warps, **pdl,
        )


def dense_decode(
    q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    cache_seqlens: torch.Tensor, *, kv_format: str | KVFormat, softmax_scale: float | None = None,
    fp8_scale: torch.Tensor | None = None, backend: str = "fp8mla", check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-shot dense MLA decode (plans, then runs; not for CUDA graphs — use `DecodePlan`).

    q: [batch, s_q, heads, 576] bfloat16; kv_cache: uint8 [num_pages, page_size, row_bytes];
    block_table: int32 [batch, max_pages]; cache_seqlens: int32 [batch]; fp8_scale: float32 [1]
    for the ``fp8`` format. backend: ``fp8mla`` (native), or the baselines ``full_cast``,
    ``gather_cast``, ``reference`` (fp8mla.baselines). Returns (out bfloat16
    [batch, s_q, heads, 512], lse float32 [batch, s_q, heads]).
    """
    from fp8mla import baselines

    check_tensor("q", q, dtype=torch.bfloat16, ndim=4, contiguous_last=True)
    if q.shape[-1] != KV_DIM:  # (the plan checks it too; the baselines launch without it)
        raise ValueError(f"q: expected [batch, s_q, heads, {KV_DIM}], got {list(q.shape)}")
    fmt = formats.kv_format(kv_format)
    rows = as_cache_rows(kv_cache, fmt)
    if backend != "fp8mla":  # (the native plan checks its scale in run; the baselines do not)
        check_fp8_scale(fp8_scale, q.device, validate=check and fmt.name == "fp8")
        return baselines.dense_decode(backend, q, rows, block_table, cache_seqlens, fmt=fmt,
                                      softmax_scale=softmax_scale, fp8_scale=fp8_scale,
                                      check=check)
    b, s_q, h, _ = q.shape
    check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, shape=(b,), device=q.device,
                 contiguous_last=True)
    plan = DecodePlan(batch=b, num_heads=h, s_q=s_q, kv_format=fmt, page_size=rows.shape[1],
                      cache_seqlens=cache_seqlens, softmax_scale=softmax_scale, device=q.device)
    return plan.run(q, rows, block_table, cache_seqlens, fp8_scale=fp8_scale, check=check)
