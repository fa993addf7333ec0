"""Time alternative decode-kernel configurations on a GPU, each checked against the reference.

    python benchmarks/decode_variants.py OUT.json [--quick]

For every case below: the launcher's default configuration first, then the variants (tile
sizes, warps, pipeline depth, scale fold, split count, launcher constants such as the combine's
block sizes). One JSON row per (case, variant) with µs (CUDA-graph replay, median), TB/s, TFLOPS
and the ratio to the streaming-read ceiling measured in the same run. A variant that fails to
compile or to match the reference is recorded with its error, not dropped.
"""

from __future__ import annotations

import importlib
import json
import sys
from contextlib import contextmanager
from dataclasses import asdict, replace

import torch

import fp8mla.decode as decode_mod
from fp8mla.bench.decode import DecodeCase, run_case
from fp8mla.bench.harness import announced_ceiling, by_backend, env_info, script_args
from fp8mla.runtime import decode_config

# (case, format, [(label, DecodeConfig overrides, num_splits or None[, attributes set for the
# variant: fp8mla.decode's NAME, or a kernel module's "module.NAME" (`_owner`)]), ...]); the
# launcher's default configuration and split count are always timed first.
GATHER = dict(tma=False)  # every tile gathered row by row (cp.async), as before session 6
# Session 10's PDL A/B: h200-20261201-s11-*-decode-variants (±1 µs, left off); the lazy-rescale
# A/B: h200-20261130-s10-lazy-*.json; the register cap: s10-97b5942-cap-*.json. Session 11
# (BENCHMARKS.md): FP8 tiles converted once and staged as fp16 for both MMAs, 10-50% slower
# everywhere (h200-20261201-s11-once-*); 128-token tiles × 8 warps slower at 16 rows but faster
# at 32 (s11-bn128-*, s11-rows32-*), so `decode_config` takes 128 gathered tokens × 8 warps for
# 32-row FP8 programs on SM90; 8 warps at 16 rows slower everywhere (s11-2a8cd0b-w8-*); split
# counts at 16 rows re-timed with session 10's online combine: the scheduler's stay best
# (s11-2a8cd0b-splits-*). The plan is that last sweep.
# Session 13: the combine of one long request (B=1 × 128K: 8 rows, 256 splits) in 16-dim programs
# (256 programs, all splits in one step) instead of 32 (128 programs, two steps), ABAB: −0.3 /
# −0.6 µs (fp8 / fp8_ds_mla), the pool case +0.15 (s13-75a34e4-decode-variants.json), so
# `combine_blocks` now narrows to 16 dims only where 32 would take more than one step. The plan
# is back to session 11's split sweep.
# Session 15's two prepared arms, timed in session 16 (s16-2349672-decode-variants.json): the
# rope box read first 120.6 → 114.0 µs (B=64 × 16 heads) and 44.9 → 40.7 (B=1 × 128K), now the
# only path; the rows relabelled for conflict-free words reads 0 / −0.7 µs, dropped. The plan is
# back to session 11's split sweep.
# Session 16: the Gluon kernel of ≤ 16-row programs (`fp8mla.decode.SM90_NARROW`). Its first
# form (64-token tiles, 4 or 8 warps, one program per SM) lost to the Triton kernel
# (s16-542c9c4-narrow-decode-variants.json); the plan times its 128-token form (the default
# arm) against the Triton kernel, ABAB (s16-1c82df8-narrow-decode-variants.json: slower, off;
# removed in session 35).
# Session 18: the Gluon mma.sync kernel of ≤ 8-row programs (`fp8mla.decode.SM90_MMA8`, q in
# registers, no padding rows) against the Triton kernel, ABAB: faster in every case (B=64 × 8K
# 93.8 vs 112.7 µs, B=1 × 128K 39.5 vs 40.8; s18-2bde5d1-mma8-decode-variants.json), now the
# default. At B=1 × 128K half the scheduler's splits measured 37.9: the next run swept its
# splits (706da87: 128 splits 37.7 vs 38.9 µs at B=1, none better elsewhere — that run's JSON
# was not kept; session 19's decode_phases: 39.3 vs 39.6; left as is).
# Session 19: the first product's K order permuted so that its A-operand loads are free of
# bank conflicts (`decode_sm90_mma8.LAT_K_BITS`; tests/test_bank_model.py: 288 extra
# wavefronts a tile before, 0 after) against the stored order, ABAB: 93.0 / 93.5 vs 93.7 / 93.7
# µs at B=64 × 8K × 8 heads, 39.6 vs 39.7 at B=1 × 128K (s19-dc1cb31-decode-variants.json, both
# orders' Nsight Compute counters beside it): kept, the switch dropped. The plan is back to
# session 18's split sweep.
# Session 20: the ≤ 8-row kernel's fp8_ds_mla form (`fp8mla.decode.SM90_MMA8_DS`: the sparse
# kernel's per-chunk tile fed by TMA) at 2 and 3 ring stages against the Triton kernel, ABAB
# (s20-9673ca2-mma8-ds-decode-variants.json: on since). Session 21: the fp8 ≤ 8-row kernel's
# wide form for 9–16 rows (`fp8mla.decode.SM90_MMA16`: qᵀ read from shared memory every tile)
# at 2 and 3 ring stages against the Triton kernel, ABAB (s21-9e84ea7-mma16-*: 2 stages 106.4 /
# 107.0 µs against 114.3 / 114.0 at B=64 × 8K × 16; 3 stages 118.2; slower at B=1 × 128K ×
# 16, 47.6 against 42.7, and B=8 × 32K, 67.9 against 67.3); with the mask and rescale skipped
# where no row needs them (`SM90_MMA8_LEAN`, a switch since removed) −0.3 µs there, ±0.1 µs on the 8-row kernel
# (s21-f104fcf-mma16-*); qᵀ by ldmatrix against 4-byte loads, ABAB: 106.6 / 106.9 against
# 106.0 / 106.2 µs, s_q 2 × 8 106.4 against 105.6, B=128 × 4K 106.9 against 107.5 (the 4-byte
# loads kept); 3 or 6 splits instead of the scheduler's 4: 123.5 / 136.2; B=32 × 8K (16 tiles
# a program) 66.0 against the Triton kernel's 65.7, B=16 × 8K (8) 47.0 against 42.1
# (s21-1e438e4-decode-variants.json). Each tile's copy issued at the top of the tile before
# against after its P barrier, ABAB: the wide form (2 stages) 105.0 / 105.7 against 107.3 /
# 107.2 µs, s_q 2 × 8 106.0 against 107.1, B=128 × 4K 106.7 against 108.3, B=32 × 8K 63.8
# against 66.5 (the Triton kernel: 65.6); the 8-row form (3 stages) 97.0 / 97.0 against 95.3 /
# 95.3, B=1 × 128K 41.0 / 40.7 against 39.9 / 39.8 (s21-9271bf1-decode-variants.json): 2-stage
# rings issue early since. The same for the fp8_ds_mla kernel's 2-stage ring, ABAB: 112.8 /
# 112.8 against 107.1 / 107.1 µs at B=64 × 8K × 8, 45.6 / 45.5 against 44.8 / 44.7 at B=1 ×
# 128K (dropped); the wide form at 8 tiles a program: B=16 × 8K 45.5 against 42.3, B=1 × 128K
# × 16 45.7 against 42.6 (s21-42e9e38-decode-variants.json), so it serves programs of ≥ 16
# tiles (final code: 104.1 / 104.6 against 114.2 / 113.9, s21-13a6f39-decode-variants.json).
# Split partials in bf16 (`PARTIALS_BF16`) against fp32, ABAB: B=64 × 8K × 16 105.2 / 105.5
# against 104.1 / 104.3, B=1 × 128K 38.6 / 38.6 against 39.8 / 39.8 (kept off then; since
# session 31 on from 16 splits: `PARTIALS_BF16_MIN_SPLITS`); the fp8_ds_mla
# wide form (`SM90_MMA16_DS`) against the Triton kernel: B=64 × 8K × 16 125.3 / 125.3 against
# 156.8 / 156.9, s_q 2 × 8 124.3 against 157.1, B=32 74.1 against 92.7 (switched on;
# s22-e8f3867-wide-ds-decode-variants.json). The split combine as a programmatic
# dependent launch (`PDL`; session 11: within noise on the Triton kernel) against the default,
# ABAB, on the Gluon kernels' cases: every pair faster with it, by 0.1–0.4 µs (switched on;
# s22-87b29d9-pdl-decode-variants.json). The fp8_ds_mla wide form at 8 tiles a
# program (the length rule measured on fp8, whose Triton kernel is closer) against the Triton
# kernel, ABAB: B=16 × 8K 50.0 / 50.0 against 61.0 / 61.1, B=1 × 128K × 16 50.7 / 50.7 against
# 63.2 / 63.2, and fp8 B=1 × 128K × 16 45.9 against 42.2 (s22-1380eb4-decode-variants.json;
# `SM90_MMA16_DS_MIN_TILES` = 8). Shorter programs still — the fp8_ds_mla wide form at
# 4, 2 and 1 tiles a program, the fp8 one at 12 — against the Triton kernel: ds B=8 37.1 / 37.0
# against 46.4 / 46.7, B=4 29.6 against 37.6, B=1 × 4K 16.1 against 16.8 (no length rule since);
# fp8 B=24 55.3 / 55.4 against 53.4 / 53.4 (16 tiles stays; s22-0fa10af-decode-variants.json).
# The plan is that last A/B.
# Session 23: B=1 × 128K's split count again (sessions 18–19: 128 splits 0.3–1.6 µs faster than
# the scheduler's 256 in three runs, left as is), ABAB: 37.5 / 37.6 against 38.8 / 39.2 µs;
# fp8_ds_mla 50.9 / 50.9 against 44.9 / 44.9; 132 splits 39.2 (s23-7900be9-decode-variants.json).
# `benchmarks/timeline.py` (s23-7900be9-timeline.json): in one wave of two programs an SM the
# programs the block scheduler placed second leave ~2.5 µs after their SM's first. The 8-row
# forms at one program per SM (s23-7b97f72-, s23-36e7d63-, s23-92cfcfa-decode-variants.json):
# fp8 at 4 stages faster or level at every batch, 5 stages slower; fp8_ds_mla at 3 stages
# faster where such programs have ≤ 32 tiles. Both were switched on, then off again: this
# timer's flush leaves the L2 dirty, and with a clean one (`flush_ab.py`, s23-224ae48- and
# s23-3ce86b0-flush-ab.json) two programs an SM are faster in nearly every case. A/Bs of
# schedules read both columns now: each row has `us` (do_bench's timer) and `us_clean_l2`
# (the same replay after a reading flush). The plan is back to that last sweep's first A/B.

B1_SPLITS = [("128 splits", None, 128), ("default again", None, None),
             ("128 splits again", None, 128)]
# Session 42: bf16 rows at 64 rows a program (128 heads) in 64-token tiles at 2 stages (221 KB,
# one program an SM as the default's 32 × 3 at 184 KB): offline sm_90, 968 loop instructions a
# 64-token tile against 784 a 32-token one on triton 3.6 (15.1 against 24.5 a token); on 3.9
# 1,259 (224 B of stack) against 1,042 (96 B). ABAB, and the same tile copied by TMA.
BF16_TILE64 = [("64 tokens, 2 stages", dict(block_n=64, num_stages=2), None),
               ("default again", None, None),
               ("64 tokens, 2 stages again", dict(block_n=64, num_stages=2), None),
               ("64 tokens by TMA, 2 stages", dict(block_n=64, tma=True, tma_stages=2), None)]
# Session 42's result: bf16 64-row programs take 64-token tiles by TMA, 2 deep (3173448;
# h200-20261205-s42-8f7c82f-triton3{6,8,9}-decode-variants.json).
# Session 45: fp8 plans of 17–32 query rows on the fp8 wide form in head blocks of 16 // s_q
# heads (`SM90_MMA16_FP8_HEAD_BLOCKS`; the default since: on triton 3.8, and from 4 splits a
# request on other Tritons, the rule these runs gave), ABAB against
# the Triton kernel's 32-row program — on 3.8, which stages that program's converted FP8
# operands through shared memory (H200, s_q 2 × 16: 307.8 µs against 3.6's 169.2), and on 3.6
FP8_BLOCKS = [("triton kernel", None, None, {"SM90_MMA16_FP8_HEAD_BLOCKS": False}),
              ("head blocks", None, None, {"SM90_MMA16_FP8_HEAD_BLOCKS": True}),
              ("triton kernel again", None, None, {"SM90_MMA16_FP8_HEAD_BLOCKS": False}),
              ("head blocks again", None, None, {"SM90_MMA16_FP8_HEAD_BLOCKS": True})]
# First run (h100-20261207-s45-43b83d5-triton3{6,8,9}-decode-variants.json): B=64 × 8K (s_q 2
# × 16, 32 heads, s_q 4 × 8), B=8 × 32K × s_q 2 × 16, B=1 × 128K × 32, B=16 × 4K × s_q 2 × 16 —
# head blocks far faster on 3.8, faster on 3.6 / 3.9 at 16 and 128 splits, slower at 2. The
# second (s45-897e083-): the splits between (B=32 × 8K: 4, B=16: 8, B=4 × 32K: 32), all faster.
# Session 48 — the fp8 wide form's length rule (`SM90_MMA16_MIN_TILES`: ≥ 16 tiles a program,
# measured on 3.6 against the Triton kernel's 16-row program) on triton 3.8, whose Triton
# kernel is slower (B=16 × 4K × s_q 2 × 16, 4 tiles a program: 52.1 µs against 3.6's 39.7):
# short programs in head blocks and 16-head plans on the wide form, against the default
SHORT = [("wide form, any length", None, None,
          {"SM90_MMA16_MIN_TILES": 0, "SM90_MMA16_FP8_HEAD_BLOCKS": True}),
         ("default again", None, None),
         ("wide form, any length again", None, None,
          {"SM90_MMA16_MIN_TILES": 0, "SM90_MMA16_FP8_HEAD_BLOCKS": True})]
# Result (H100, h100-20261207-s48-65560b5-triton38-decode-variants.json): the wide form faster
# in every case, by 22–36% (B=16 × 4K × s_q 2 × 8: 33.1 against 52.0 µs; B=1 × 16K × 32 heads
# 19.6 against 27.0): on 3.8 no length rule since (`fp8mla.decode.mma16_min_tiles`). The plan
# is that A/B (h100-20261207-s48-*).
# Session 52 — dense plans of 33–64 query rows with every query's heads in one 64-row Gluon
# program (`SM90_PACKED`, prepared without a GPU, off by default) against the default (the
# Triton kernel's 64-row programs), ABAB. Prediction: ~1.35× where compute-bound (the 64-row
# Gluon kernel's 393 against the Triton kernel's 539 µs at 128 heads).
PACKED = [("packed", None, None, {"SM90_PACKED": True}),
          ("default again", None, None),
          ("packed again", None, None, {"SM90_PACKED": True})]
PLAN = [(DecodeCase(64, 8192, 16, s_q=4), "fp8", PACKED),
        (DecodeCase(64, 8192, 32, s_q=2), "fp8", PACKED),
        (DecodeCase(64, 8192, 16, s_q=4), "fp8_ds_mla", PACKED),
        (DecodeCase(8, 8192, 16, s_q=4), "fp8", PACKED),
        (DecodeCase(1, 131072, 16, s_q=4), "fp8", PACKED),
        (DecodeCase(64, 8192, 11, s_q=3), "fp8", PACKED)]


def variants(case: DecodeCase, fmt: str, extra):
    """(label, config or None for the default, num_splits or None for the scheduler's,
    module attributes to set)."""
    base = decode_config(90, fmt, case.heads, case.s_q)
    yield "default", None, None, {}
    for label, over, splits, *patch in extra:
        yield label, replace(base, **over) if over else None, splits, (patch or [{}])[0]


# the kernel a record's note names (`fp8mla.bench.harness.kernel_note`) → (module in
# fp8mla.kernels, function), by the note's kernel, 64-row form and the case's format
_KERNELS = {("sm90", "tma"): ("decode_sm90", "_mla_decode_sm90_kernel"),
            ("sm90", "gather"): ("decode_sm90", "_mla_sparse_sm90_kernel"),
            ("mma", "fp8"): ("decode_sm90_mma8", "_mla_decode_mma8_kernel"),
            ("mma", "fp8_ds_mla"): ("decode_sm90_mma8_ds", "_mla_decode_mma8_ds_kernel")}


def kernel_resources(note: str, fmt: str) -> dict:
    """Registers, spills and shared memory of the decode kernel a record's ``note`` names,
    compiled last (Triton's in-memory cache): the Triton kernel, or the Gluon one serving."""
    try:
        kernel = note.split("kernel=")[1].split()[0]
        form = note.split("form=")[1].split()[0] if "form=" in note else None
        key = ((kernel, form) if kernel == "sm90"
               else ("mma", fmt) if kernel in ("mma8", "mma16") else None)
        mod, name = _KERNELS.get(key, ("decode", "_mla_decode_kernel"))
        fn = getattr(importlib.import_module(f"fp8mla.kernels.{mod}"), name)
        cache = fn.device_caches[torch.cuda.current_device()][0]
        k = list(cache.values())[-1]
        k._init_handles()
        return {"regs": k.n_regs, "spills": k.n_spills, "shared": k.metadata.shared,
                "compiled": name}
    except Exception as e:  # noqa: BLE001 — informative only
        return {"resources_error": str(e)[:100]}


def _owner(key: str) -> tuple:
    """(module, attribute) a variant's patch key names: ``NAME`` in `fp8mla.decode`,
    ``kernel_module.NAME`` in `fp8mla.kernels`."""
    if "." not in key:
        return decode_mod, key
    mod, name = key.rsplit(".", 1)
    return importlib.import_module(f"fp8mla.kernels.{mod}"), name


@contextmanager
def patched(patch: dict):
    """Within the block, each key of ``patch`` (`_owner`'s names) set to its value; restored
    after, however the block ends."""
    saved = {k: getattr(*_owner(k)) for k in patch}
    try:
        for k, v in patch.items():
            setattr(*_owner(k), v)
        yield
    finally:
        for k, v in saved.items():
            setattr(*_owner(k), v)


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    quick = "--quick" in sys.argv
    env = env_info()
    ceiling = announced_ceiling(env)
    rows = []
    for case, fmt, extra in PLAN[:2] if quick else PLAN:
        for label, cfg, splits, patch in variants(case, fmt, extra):
            row = {"case": case.name(f"dense_decode/{fmt}", fmt), "variant": label,
                   "config": asdict(cfg) if cfg else None, "splits": splits, "patch": patch}
            try:
                with patched(patch):
                    recs = run_case(case, fmt, env, ceiling, config=cfg, num_splits=splits)
                rec = by_backend(recs, "fp8mla_graph")
                clean = by_backend(recs, "fp8mla_graph_cleanL2").us
                row.update(kernel_resources(rec.note or "", fmt))
                row.update(us=rec.us, us_clean_l2=clean, TBps=rec.TBps, TFLOPS=rec.TFLOPS,
                           ratio=round(rec.TBps / ceiling, 3), note=rec.note)
                print(f"{row['case']:<42} {label:<28} {rec.us:8.1f} us (clean L2 {clean:6.1f}) "
                      f"{rec.TBps:5.2f} TB/s {rec.TFLOPS:6.1f} TFLOPS  regs {row.get('regs')} "
                      f"spills {row.get('spills')} smem {row.get('shared')}", flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{row['case']:<42} {label:<28} ERROR {row['error'][:120]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:  # after every row: a run cut short keeps its rows
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
