"""A/B of launcher settings under both L2 states, on a GPU.

    python benchmarks/flush_ab.py OUT.json [PLAN]    (PLAN: a name of `PLANS`, the first by default)

`fp8mla.bench`'s `fp8mla_graph` rows time with do_bench, whose zeroing flush leaves the L2
dirty before every call (`l2_state.py`); a serving step starts with it clean (the
`fp8mla_graph_cleanL2` rows). This times each case's CUDA-graph replay after both flushes
(`fp8mla.bench.harness.l2_flushes`, `event_median_us`) for arms A, B, A, B — each arm a set of
`fp8mla.decode` or kernel-module attributes (`decode_variants.patched`), each case checked
against the reference first. Session 23 found two schedules that do_bench's flush favoured and
a clean L2 did not (below).
"""

from __future__ import annotations

import sys

from decode_variants import patched

from fp8mla.bench.decode import DecodeCase, checked_plan
from fp8mla.bench.harness import (
    announced_ceiling,
    env_info,
    event_median_us,
    graphed,
    keep_row,
    l2_flushes,
    script_args,
)
from fp8mla.bench.sparse import checked_sparse_plan

# Session 23, each with its H200 result (µs, zero / read flush, ABAB):
# - fp8 8-row form at 4 stages (one program an SM) against 3 (two), s23-224ae48-flush-ab.json:
#   B=64 × 8K 93.7 / 88.1 and 94.5 / 88.7 against 93.9 / 85.9 and 93.9 / 85.8; B=1 × 128K
#   38.0 / 33.7, 39.4 / 33.7 against 39.0 / 32.6, 39.3 / 32.8 — 3 stages kept;
# - fp8_ds_mla's 8-row form at 3 stages for programs of ≤ 32 tiles against 2 everywhere,
#   s23-3ce86b0-flush-ab.json: B=8 × 32K 67.3 / 60.4 against 66.9 / 57.3 — 2 kept;
# - splits uneven by launch order (the first program on each SM 2 or 4 tiles longer; an
#   experiment at 19c0a45, since removed), s23-19c0a45-skew-flush-ab.json: B=64 × 8K × 16 (wide
#   form) skew 2 104.5 / 100.2 and 103.8 / 99.4 against even 103.9 / 100.5 and 104.7 / 100.9,
#   skew 4 level; B=64 × 8K × 8 skew 2 93.0 / 84.8, 93.2 / 84.8 against 94.1 / 85.1, 93.9 / 85.3
#   (B=1's rows are void: its integer shares piled the rounding onto the last split).
# Session 24: the ≤ 16-row kernels' first product as FP8 wgmma (`SM90_MMA16_QK8` for the fp8
# wide form, `SM90_MMA8_DS_QK8` for fp8_ds_mla) against mma.sync
# (h200-20261202-s24-qk8b-flush-ab.json); then fp8_ds_mla plans of 17–32 rows on the wide form
# in head blocks (`SM90_MMA16_DS_HEAD_BLOCKS`, the default arm) against the Triton kernel
# (h200-20261202-s24-965c07f-head-blocks-flush-ab.json).
# Session 25: the sparse ≤ 8-row kernel's rows prefetched into the L2 one or two tiles before
# their gather (an experiment, removed): slower under both flushes, by bulk prefetch
# (h200-20261202-s25-bulk-prefetch-flush-ab.json: B=64 × 8 heads 47.4 / 41.2 → 54.1 / 49.1 and
# 57.8 / 51.7) and by line prefetch (s25-line-prefetch-flush-ab.json: → 49.8 / 45.6 and 56.9 /
# 46.7); then, the FP8 first product switched off by default for its precision
# (`benchmarks/qk8_precision.py`), its cost measured: mma.sync (the default arm) against FP8
# wgmma. A case is a (DecodeCase, format) or a sparse (batch, heads, topk, s_q) over fp8_ds_mla
# rows (h200-20261202-s25-10762b3-qk8-cost-flush-ab.json).
# Session 26: the ≤ 16-row kernels merging ≤ 4 / 8 splits themselves, the last split of each
# (request, head block) to finish counting arrivals with an integer atomic (an experiment at
# 64e3d42, since removed), against the combine kernel (h200-20261203-s26-64e3d42-merge-flush-
# ab.json): level at best — fp8 B=64 × 8K × 16 104.1 / 100.9 and 103.4 / 100.1 against
# 102.9 / 99.5 and 103.5 / 99.7, × 8 heads 95.1 / 86.9 against 94.4 / 85.8, fp8_ds_mla MTP
# s_q 2 × 16 212.6 / 212.2 against 209.7 / 209.5, sparse B=64 × 8 48.4 / 42.2 against
# 47.7 / 41.5. Then the sparse ≤ 8-row kernel without the CTA barriers triton 3.6's shared-
# memory hazard analysis puts between its gather's four latent copies (one copy op) and between
# its four P stores (four allocations) — 11 barriers a tile → 5 (an experiment at 430bef4, since
# removed; triton 3.9 puts none there), h200-20261203-s26-barriers-flush-ab.json: level — B=64
# × 8 heads 47.3 / 40.9 and 47.6 / 41.3 against 46.9 / 40.8 and 47.4 / 41.4, B=128 × 8 72.8 /
# 66.3 twice against 73.1 / 66.9 and 72.9 / 66.9, s_q 2 × 4 heads 69.5 / 62.7 and 69.5 / 62.8
# against 69.5 / 63.0 and 69.5 / 63.4: the warps wait there for other reasons.
# Session 27: the ≤ 16-row kernels' online softmax without the max across warps each tile —
# each warp's P against its own reference, reconciled after P's barrier (2 fewer barriers a
# tile; an experiment at 0eef3d2, since removed) — against the max across warps
# (h200-20261203-s27-0eef3d2-warp-max-flush-ab.json): slower or level — fp8 B=64 × 8K × 16
# 105.3 / 102.4 and 105.1 / 102.4 against 103.0 / 99.4 and 103.7 / 99.8, fp8_ds_mla × 16
# 136.6 / 132.1 against 124.8 / 119.7, B=1 × 128K and sparse B=64 × 8 within 0.5.
# Then the dense fp8 ≤ 16-row kernel's softmax reference moved only once a row's max passed it
# by 2^8, so the accumulators' rescale (taken on most tiles of a 16-row program) ran on few (an
# experiment at 346f864, since removed), against the exact running max
# (h200-20261203-s27-346f864-lazy-flush-ab.json): level — B=64 × 8K × 16 102.1 / 98.2 and
# 102.7 / 98.7 against 101.8 / 98.4 and 102.5 / 99.0; × 8 heads, B=1 × 128K and s_q 2 × 8
# within 0.3 / 0.6.
# Session 28: B=1 × 128K at the scheduler's splits against `MAX_SPLITS` 128 (one program per
# SM; a scratch script setting this module's ARMS and CASES), h200-20261203-s28-d50327d-half-
# splits-flush-ab.json: fp8 × 8 heads 37.6 / 33.1 and 37.8 / 33.1 against 38.6 / 32.0 and
# 39.3 / 32.3 (do_bench favours it, a clean L2 does not), fp8_ds_mla 51.3 / 47.9 against 44.7 /
# 36.7, fp8 × 16 heads 43.6 / 41.9 against 42.2 / 40.6, bf16 level — the scheduler stays.
# Then the sparse ≤ 8-row kernel's next-tile gather in five pieces between the tile's score
# chains (an experiment at e64b432, since removed) against at once after the tile's barrier,
# h200-20261203-s28-e64b432-spread-flush-ab.json: B=64 × 8 heads 46.4 / 41.8 and 46.3 / 41.7
# against 47.0 / 41.2 and 47.8 / 41.6, B=128 × 8 72.2 / 68.6 against 72.7 / 66.9, s_q 2 × 4
# heads 68.8 / 65.4 against 69.7 / 63.4 — faster under do_bench, slower clean: not kept.
# Session 29–30: the fp8 8-row and wide forms as one program an SM of two warp groups taking
# alternate tiles of one 5-stage ring (an experiment at 520f686, since removed) against two
# programs an SM, h200-20261203-s30-520f686-pair-flush-ab.json: slower everywhere — B=64 × 8K ×
# 16 119.7 / 116.8 against 103.7 / 100.2, B=64 × 8K × 8 96.4 / 87.3 against 94.9 / 86.9,
# B=1 × 128K × 8 41.0 / 34.3 against 39.5 / 33.2 (the groups' two copies of the tile loop
# starve the instruction cache: -pair-ncu.txt).
# Session 31 (scratch scripts setting ARMS and CASES): where the decode programs let the
# combine (a programmatic dependent) launch — at the grid's exit, at each program's entry, after
# its loop — h200-20261203-s31-ca59e0e-pdl-ab.json and (exit against after the loop, four
# pairs) -da86261-pdl-ab2.json: entry slower everywhere but 64 heads (fp8 B=1 × 128K 40.9 /
# 34.4 against 39.5 / 32.6), after the loop faster by 0.1–0.6 µs except the fp8 wide form
# (B=64 × 8K × 16 103.3 / 99.9 against 103.1 / 99.3) — `fp8mla.decode.PDL_SIGNAL`. Then the
# dense ≤ 16-row splits weighted by launch order (the first program on each SM 18/16 or 20/16
# of the others' share; an experiment at 708d2aa, since removed), -708d2aa-lead-weight-ab.json:
# slower — fp8 B=64 × 8K × 16 104.3 / 99.8 against 102.6 / 98.7, B=1 × 128K 39.3 / 34.4
# against 39.2 / 32.6; fp8_ds_mla × 16 the one exception (122.3 / 116.6 against 122.7 / 118.1).
# Then split partials in bf16 against float32 by split count (`PARTIALS_BF16`, since replaced
# by `PARTIALS_BF16_MIN_SPLITS`), -0d56188-partials-ab{,2,3}.json: faster from 16 splits on,
# slower at 2–4 — the rule now in `fp8mla.decode`. Session 24's arms (FP8 wgmma first product
# against mma.sync) were this module's plan until then.
# Session 32: the ≤ 16-row kernels' rows stored 16 bytes a store against one element a store
# (`SM90_STORES_IN_ORDER`, since the one path: `decode_sm90_mma8._store_in_order`), dense fp8
# with the partials' dtype as the rule picks it and in bf16 everywhere, h200-20261203-s32-
# 6137365-instores-ab.json, then fp8_ds_mla and sparse, -c5a120d-instores-ab2.json: faster in
# every case but sparse s_q 2 × 4 heads (+0.9 / +0.8) — fp8 B=64 × 8K × 16 104.2 / 100.7 →
# 102.4 / 97.6, B=1 × 128K × 8 38.4 / 31.4 → 36.9 / 30.2; bf16 partials at 2–4 splits lose
# with either store. Then (a scratch script's ARMS) the combine's warps fitted to its rows
# (`fp8mla.decode.combine_warps`) against 4, and with bf16 partials everywhere,
# -f2ba160-combine-warps-ab.json: bf16 faster at every split count once fitted — B=64 × 8K ×
# 16 101.0 / 96.4 → 98.3 / 93.5, sparse B=16 × 8 23.6 / 21.0 → 21.4 / 18.9.
# Session 33: the combine's programs under 128 dims at 4, 2 and 1 warps (prepared in session
# 32; `COMBINE_NARROW_WARPS`, since removed: `combine_warps` gives them one),
# h200-20261203-s33-0e48876-narrow-warps-ab.json: 1 warp fastest in every case — fp8 B=1 ×
# 128K × 8 (256 splits, 16-dim programs) 36.6 / 30.0 → 36.2 / 29.7, fp8_ds_mla 42.2 / 34.5 →
# 41.9 / 34.1, B=2 × 64K 36.4 / 30.0 → 35.8 / 29.5, B=4 × 32K 36.8 / 30.3 → 35.8 / 29.3,
# sparse B=4 × 8 14.3 / 13.3 → 13.7 / 12.6; 2 warps between.
# Then split partials in bf16 (the default since session 32) against float32 on the kernels
# that A/B never covered at 2–4 splits, h200-20261203-s33-40810d1-partials-ab.json: bf16
# slower on every 64-row kernel — dense fp8 B=32 × 8K × 64 (4 splits) 113.9 / 112.9 → 116.3 /
# 115.4, sparse B=64 × 64 (2) 76.0 / 74.5 → 77.0 / 75.7, the Triton kernel's fp8_ds_mla 64-head
# programs 272.7 / 270.1 → 280.8 / 278.2 — faster on its 16-row ones (bf16 rows × 16 heads,
# 154.2 / 145.0 → 152.9 / 143.0): `PARTIALS_BF16_MAX_ROWS` 16 (since replaced by
# `fp8mla.decode.partials_dtype`).
# Then bf16 partials up to 16 rows a program (the default), 32 and 64, h200-20261203-s33-
# 0d53655-rows-ab.json: 64-row kernels slower in bf16 at many splits too (fp8 B=1 × 128K × 64
# heads, 128 splits, 70.1 / 69.2 → 71.7 / 70.7; B=2 × 32K × 128 (32) 67.2 / 66.9 → 70.8 /
# 70.1; sparse B=8 × 64 (16) 28.6 / 27.7 → 32.7 / 31.7); the Triton kernel's 32-row programs
# split — fp8 s_q 2 × 16 169.7 / 168.1 → 166.9 / 165.1, bf16 rows × 32 heads 219.9 / 218.9 →
# 211.9 / 210.7, but fp8 × 32 heads 169.1 / 167.5 → 174.2 / 172.5 (its sm_90 compile spills
# 37 stores with bf16 partials against 2).
# Then the Triton kernel (the Gluon ≤ 16-row kernels switched off) at ≤ 16 rows with bf16
# partials against float32 — the kernel every other GPU runs; its fp8 compile for sm_90
# spills 54 stores with bf16 partials against none (triton 3.6) —
# h200-20261203-s33-f08c00a-triton-partials-ab.json: bf16 slower over FP8 rows — fp8 B=1 ×
# 128K × 8 39.6 / 37.6 → 43.9 / 41.0, fp8_ds_mla B=64 × 8K × 16 157.5 / 152.9 → 161.5 / 158.9,
# sparse level, fp8 B=64 × 8K × 16 the exception (113.8 / 111.2 → 112.8 / 110.4). The rule
# since: `fp8mla.decode.partials_dtype` (bf16 on the ≤ 16-row Gluon kernels and the Triton
# kernel over bf16 rows of ≤ 32 rows a program; an arm forcing bf16 now needs
# `PARTIALS_BF16_EVERYWHERE`).
# Session 35: session 33's and 34's prepared plans (until session 34 the module held one pair,
# ARMS and CASES, which the scratch scripts above replaced), a499cda:
# - "triton-lanes": the Triton kernel's bf16 stores joined into rows against lane by lane
#   (`TRITON_BF16_STORES_JOINED`, since removed: the joined compiles spill), the Gluon ≤ 16-row
#   kernels off, each with float32 and bf16 partials, h200-20261204-s35-a499cda-triton-lanes-
#   ab.json: lane by lane slower or level but in one case — one-split fp8 B=256 × 4K × 16
#   206.2 / 203.5 → 218.0 / 216.6, fp8_ds_mla B=128 × 8K × 64 539.6 / 537.0 → 594.9 / 589.6,
#   bf16 partials fp8_ds_mla B=64 × 8K × 64 280.0 / 278.6 → 328.3 / 325.1; split plans with
#   float32 partials (no bf16 store) within 0.5; the exception, bf16 partials at B=1 × 128K × 8
#   (256 splits) 44.1 / 41.4 → 42.4 / 40.6, is slower than float32 there (39.6 / 37.7). This
#   plan is gone with its switch (it runs at a499cda).
# - "sm90-rows": the 64-row Gluon kernels' bf16 rows in dim order, 16-byte stores
#   (`SM90_ROWS_IN_ORDER`), against the accumulator's 4-byte stores, with float32 and bf16
#   partials, h200-20261204-s35-a499cda-sm90-rows-ab.json: in order with bf16 partials fastest
#   in every case — fp8 B=1 × 128K × 64 (128 splits) 70.6 / 69.4 → 66.2 / 65.4, one-split
#   B=64 × 8K × 128 393.4 / 392.9 → 389.3 / 387.1, sparse B=128 × 128 242.7 / 241.5 → 234.3 /
#   232.9 (`fp8mla.decode.SM90_ROWS_IN_ORDER` and `partials_dtype` give the pair since).
# Session 36:
# - "ds-paged": dense fp8_ds_mla plans of 64-head programs on the sparse 64-row Gluon kernel
#   reading pool rows through the block table (`SM90_DS_PAGED`) against the Triton kernel,
#   h200-20261204-s36-a0ebd3d-ds-paged-flush-ab.json: faster in every case — B=64 × 8K × 128
#   541.6 / 539.1 → 441.3 / 438.1, pages of 16 614.8 / 613.5 → 438.9 / 436.3, pages of 1
#   644.0 / 641.2 → 447.3 / 444.3, B=64 × 8K × 64 272.8 / 270.7 → 231.6 / 229.9, B=1 × 128K ×
#   64 85.4 / 84.5 → 73.2 / 72.4, B=2 × 32K × 128 82.4 / 82.3 → 72.4 / 72.5, B=128 × 4K × 48
#   276.8 / 274.8 → 230.6 / 228.5.
# - "mtp": dense plans of s_q 2–4 on the 64-row Gluon kernels, one query's 64 heads a program
#   (`SM90_MTP`), against the Triton kernel (all of a head block's query rows a program),
#   h200-20261204-s36-d0c2cb9-mtp-flush-ab.json: faster in every case — fp8 B=64 × 8K × 128 ×
#   s_q 2 1057.2 / 1056.0 → 772.7 / 770.7, B=32 × 4K × 128 × s_q 4 546.9 / 541.4 → 400.5 /
#   396.6, fp8_ds_mla B=64 × 8K × 128 × 2 999.4 / 1004.9 → 876.8 / 872.9.
# - "fp8-gather": fp8 rows (per-tensor scale) on the same gather kernel (`SM90_GATHER_FP8`) —
#   dense plans over pages shorter than a tile, sparse lists — against the Triton kernel.
# - "sparse-min-heads": sparse plans of 17–63 heads on the 64-row gather kernel (part-empty
#   programs; `SPARSE_SM90_MIN_HEADS` lowered) against the Triton kernel they took then,
#   h200-20261204-s36-7dc3c2b-sparse-min-heads-flush-ab.json: faster in every case — B=64 × 32
#   100.4 / 96.7 → 69.2 / 68.1, B=128 × 32 181.0 / 177.7 → 119.4 / 117.5, × 24 97.8 / 94.8 →
#   68.8 / 67.9 (`SPARSE_SM90_MIN_HEADS` 17 since: the plan's first arm is now the default, its
#   second the old bound).
# - "sparse-16-heads": the same at 9–16 heads (the Triton kernel's 16-row programs),
#   h200-20261204-s36-808d8ec-sparse-16-heads-flush-ab.json: the Triton kernel faster but at
#   small batches — B=64 × 16 66.6 / 63.9 against 67.6 / 66.3, B=128 × 16 103.8 / 101.5
#   against 118.1 / 116.6, B=16 × 16 37.2 / 34.7 against 27.5 / 26.8 — the bound stays 17.
# - "sparse-16-heads-batch" (prepared in session 36, run in 37): the same arms over batch sizes
#   between, h200-20261204-s37-e3a61e4-sparse-16-heads-batch-flush-ab.json: the gather kernel
#   faster up to 32 queries — B=8 × 16 31.0 / 29.3 → 21.0 / 20.7, B=24 44.1 / 41.2 → 38.0 /
#   36.8, B=32 48.1 / 44.5 → 41.2 / 40.0, B=32 × 12 43.6 / 40.2 → 41.1 / 39.6 — slower at B=48
#   (59.2 / 55.1 → 66.6 / 66.2) and on fp8 rows (B=32 × 16 37.6 / 33.6 → 38.3 / 37.8):
#   `SPARSE_SM90_SMALL_BATCH` 32 since (fp8_ds_mla only). Both 16-head plans' first arm turns
#   that rule off, so their arms stay what they were.
# - "sparse-16-heads-fp8": the same arms for fp8 lists (the rule leaves them on the Triton
#   kernel: at B=32 × 16 it was faster) at smaller batches, and fp8_ds_mla at 9–12 heads,
#   h200-20261204-s37-fba9a46-sparse-16-heads-fp8-flush-ab.json: fp8 lists faster on the Triton
#   kernel at small batches too (B=8 × 16 19.6 / 18.4 against 19.9 / 19.7, B=16 × 16 25.9 /
#   24.1 against 26.0 / 25.6, × 12 25.1 / 22.7 against 25.5 / 24.7); fp8_ds_mla faster on the
#   gather kernel at 9 and 12 heads (B=16 × 9 30.5 / 27.9 → 27.1 / 25.8, B=8 × 12 26.4 / 24.8 →
#   20.4 / 20.1): the rule stands as it is.
# The plans, each (arms, cases) — "sm90-rows" kept as the regression check of its default
# against the switch off:
PLANS = {
    "sm90-rows": (
        [("in order, bf16 partials", {}),
         ("accumulator's stores, float32 partials", {"SM90_ROWS_IN_ORDER": False})],
        [(DecodeCase(32, 8192, 64), "fp8"), (DecodeCase(2, 32768, 128), "fp8"),
         (DecodeCase(1, 131072, 64), "fp8"), (DecodeCase(64, 8192, 128), "fp8"),
         (8, 64, 2048, 1), (64, 64, 2048, 1), (128, 128, 2048, 1)]),
    "ds-paged": (
        [("Gluon, paged gather", {}), ("Triton kernel", {"SM90_DS_PAGED": False})],
        [(DecodeCase(64, 8192, 128), "fp8_ds_mla"), (DecodeCase(64, 8192, 64), "fp8_ds_mla"),
         (DecodeCase(2, 32768, 128), "fp8_ds_mla"), (DecodeCase(1, 131072, 64), "fp8_ds_mla"),
         (DecodeCase(128, 4096, 48), "fp8_ds_mla"),
         (DecodeCase(64, 8192, 128, page_size=1), "fp8_ds_mla"),
         (DecodeCase(64, 8192, 128, page_size=16), "fp8_ds_mla")]),
    "mtp": (
        [("Gluon, a program a query", {}), ("Triton kernel", {"SM90_MTP": False})],
        [(DecodeCase(64, 8192, 128, s_q=2), "fp8"), (DecodeCase(64, 8192, 64, s_q=2), "fp8"),
         (DecodeCase(2, 32768, 128, s_q=2), "fp8"), (DecodeCase(32, 4096, 128, s_q=4), "fp8"),
         (DecodeCase(64, 8192, 128, s_q=2), "fp8_ds_mla"),
         (DecodeCase(64, 8192, 64, s_q=2), "fp8_ds_mla")]),
    "fp8-gather": (
        [("Gluon, gathered", {}), ("Triton kernel", {"SM90_GATHER_FP8": False})],
        [(DecodeCase(64, 8192, 128, page_size=1), "fp8"),
         (DecodeCase(64, 8192, 128, page_size=16), "fp8"),
         (DecodeCase(64, 8192, 64, page_size=1), "fp8"),
         (DecodeCase(2, 32768, 128, page_size=1), "fp8"),
         (DecodeCase(64, 8192, 128, s_q=2, page_size=1), "fp8"),
         (128, 128, 2048, 1, "fp8"), (64, 64, 2048, 1, "fp8")]),
    "sparse-min-heads": (
        [("64-row gather kernel from 17 heads", {}),
         ("Triton kernel (64 heads on)", {"SPARSE_SM90_MIN_HEADS": 64})],
        [(64, 32, 2048, 1), (128, 32, 2048, 1), (64, 48, 2048, 1), (64, 24, 2048, 1),
         (16, 32, 2048, 1), (64, 32, 2048, 1, "fp8")]),
    "sparse-16-heads": (
        [("Triton kernel (17 heads on)", {"SPARSE_SM90_SMALL_BATCH": 0}),
         ("64-row gather kernel from 9 heads", {"SPARSE_SM90_MIN_HEADS": 9})],
        [(64, 16, 2048, 1), (128, 16, 2048, 1), (64, 12, 2048, 1), (16, 16, 2048, 1)]),
    "sparse-16-heads-batch": (
        [("Triton kernel (17 heads on)", {"SPARSE_SM90_SMALL_BATCH": 0}),
         ("64-row gather kernel from 9 heads", {"SPARSE_SM90_MIN_HEADS": 9})],
        [(8, 16, 2048, 1), (24, 16, 2048, 1), (32, 16, 2048, 1), (48, 16, 2048, 1),
         (32, 12, 2048, 1), (32, 16, 2048, 1, "fp8")]),
    "sparse-16-heads-fp8": (
        [("Triton kernel (17 heads on)", {"SPARSE_SM90_SMALL_BATCH": 0}),
         ("64-row gather kernel from 9 heads", {"SPARSE_SM90_MIN_HEADS": 9})],
        [(8, 16, 2048, 1, "fp8"), (16, 16, 2048, 1, "fp8"), (16, 12, 2048, 1, "fp8"),
         (16, 9, 2048, 1), (8, 12, 2048, 1)]),
}


def checked(case):
    """(case name, plan, checked call) of a dense or sparse case."""
    if isinstance(case[0], DecodeCase):
        dense, fmt_name = case
        return (dense.name(f"dense_decode/{fmt_name}", fmt_name),
                *checked_plan(dense, fmt_name))
    return checked_sparse_plan(*case)


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    arms, cases = PLANS[sys.argv[2] if len(sys.argv) > 2 else next(iter(PLANS))]
    env = env_info()
    ceiling = announced_ceiling(env)
    modes = l2_flushes()
    rows = []
    for case in cases:
        for label, patch in arms + arms:
            with patched(patch):
                name, plan, fn = checked(case)
                one = graphed(fn)
                row = {"case": name, "arm": label, "patch": patch, "kernel": plan.kernel,
                       "splits": plan.num_splits, "partials": str(plan.part_out.dtype)[6:],
                       "ring": plan.ring_stages, "qk8": plan.qk8}
                for mode in ("zero", "read"):
                    row[f"us_{mode}"] = round(event_median_us(one, modes[mode]), 2)
            keep_row(out_path, rows, row, env=env, ceiling_TBps=ceiling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
