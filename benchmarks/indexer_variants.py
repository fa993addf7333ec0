"""Indexer logits: the launcher's module constants varied one set at a time (the SM90 Gluon
kernel at every head count, its wgmma chains, tiles per program and ring stages; the Triton
kernel's tiles per program) on the benchmark's rows (B=64, ctx 32K, 32 and 64 index heads),
the demo's (B=1, 4160) and few heads (B=8, 16K, 4 heads), graph-timed in one run with the
read ceiling; each variant's largest absolute and relative difference from the Triton
kernel's output, whose fp16 products are exact and summed in float32 (the Gluon kernel's FP8
wgmma chains keep ~14 bits, `fp8mla.kernels.indexer_sm90`); NaN or −inf positions unlike
the Triton kernel's stop the run.

    python benchmarks/indexer_variants.py OUT.json
"""

import json
import sys
import time
from functools import partial

import torch
import triton

from fp8mla import indexer
from fp8mla.bench.harness import graphed, read_ceiling_tbps, script_args, time_us
from fp8mla.bench.sparse import _index_problem
from fp8mla.kernels import indexer_sm90

script_args(__doc__)

NAMES = ("PREFETCH_MIN_HEADS", "KEYS_AS_ROWS", "BLOCK_S", "NUM_WARPS", "MAX_TILES_PER_PROGRAM",
         "NUM_STAGES", "USE_TMA", "TMA_STAGES", "USE_SM90", "SM90_TILES_PER_PROGRAM",
         "SM90_MIN_HEADS")
SM90_NAMES = ("NS", "KSPLIT")  # `fp8mla.kernels.indexer_sm90`'s, read at each launch
SM90 = dict(SM90_MIN_HEADS=1)  # the Gluon kernel at every head count (the default: from 33)
VARIANTS = [  # (label, {constant: value}); the defaults first (session 44: the Gluon kernel,
    # one wgmma chain a tile, from 33 heads; the Triton kernel below)
    ("default", {}),
    ("sm90 kernel", SM90),
    ("sm90 two chains", dict(SM90, KSPLIT=2)),
    ("sm90 four chains", dict(SM90, KSPLIT=4)),
    ("sm90 tiles 4", dict(SM90, SM90_TILES_PER_PROGRAM=4)),
    ("sm90 tiles 16", dict(SM90, SM90_TILES_PER_PROGRAM=16)),
    ("sm90 4 stages", dict(SM90, NS=4)),  # (the default until session 45; now 3)
    ("sm90 6 stages", dict(SM90, NS=6)),
    ("triton kernel (session 6)", dict(USE_SM90=False)),
    ("triton tiles÷2", dict(USE_SM90=False, MAX_TILES_PER_PROGRAM=4)),
    ("default again", {}),
]


def differences(got, want):
    """(largest |got − want|, largest |got − want| / max(|want|, 0.01)) over the finite
    logits; raises where got has a NaN or its −inf positions differ from want's (a stray read
    or a window error, not rounding)."""
    if got.isnan().any() or not torch.equal(torch.isneginf(got), torch.isneginf(want)):
        raise AssertionError("NaN, or −inf positions unlike the Triton kernel's")
    fin = want.isfinite()
    diff = (got[fin] - want[fin]).abs()
    return diff.max().item(), (diff / want[fin].abs().clamp(min=1e-2)).max().item()


ceiling = read_ceiling_tbps()
defaults = {n: getattr(indexer, n) for n in NAMES}
sm90_defaults = {n: getattr(indexer_sm90, n) for n in SM90_NAMES}
results = []
for batch, ctx, heads in ((64, 32768, 32), (64, 32768, 64), (1, 4160, 32), (8, 16384, 4)):
    cache, table, q, w, lens = _index_problem(batch, ctx, heads, "cuda", seed=1)
    fn = partial(indexer.indexer_logits_paged, q, w, cache.layer(0), table, lens, max_len=ctx,
                 check=False)
    indexer.USE_SM90 = False  # the Triton kernel's fp16 products: exact, summed in float32
    try:
        want = fn()
    finally:
        indexer.USE_SM90 = defaults["USE_SM90"]
    for label, over in VARIANTS:
        for n in NAMES:
            setattr(indexer, n, over.get(n, defaults[n]))
        for n in SM90_NAMES:
            setattr(indexer_sm90, n, over.get(n, sm90_defaults[n]))
        try:
            err, rel = differences(fn(), want)
            us = time_us(graphed(fn))
        finally:
            for n in NAMES:
                setattr(indexer, n, defaults[n])
            for n in SM90_NAMES:
                setattr(indexer_sm90, n, sm90_defaults[n])
        tbps = batch * ctx * 132 / us / 1e6
        results.append({"batch": batch, "ctx": ctx, "heads": heads, "variant": label, **over,
                        "us": us, "TBps": tbps, "ratio": tbps / ceiling,
                        "max_abs_err": err, "max_rel_err": rel})
        print(f"B{batch} ctx{ctx} H{heads} {label:<26} {us:8.1f} us {tbps:5.2f} TB/s "
              f"({tbps / ceiling:.0%})  err {err:.2e} abs {rel:.2e} rel", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
               "ceiling_TBps": ceiling, "results": results}, f, indent=1)
