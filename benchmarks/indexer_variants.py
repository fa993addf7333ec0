"""Indexer logits: the launcher's module constants varied one set at a time (the SM90 Gluon
kernel's tiles per program and ring stages; the Triton kernel's TMA copies, tiles per program,
stages) on the benchmark's rows (B=64, ctx 32K, 32 and 64 index heads) and the demo's (B=1,
4160), graph-timed in one run with the read ceiling; every variant checked against the
defaults' output (to 1e-3: the Gluon kernel's FP8 wgmma and the Triton kernel's fp16 products
round differently).

    python benchmarks/indexer_variants.py OUT.json
"""

import json
import sys
import time
from functools import partial

import torch
import triton

from fp8mla import indexer
from fp8mla.bench.harness import graphed, read_ceiling_tbps, time_us
from fp8mla.bench.sparse import _index_problem
from fp8mla.kernels import indexer_sm90

NAMES = ("PREFETCH_MIN_HEADS", "KEYS_AS_ROWS", "BLOCK_S", "NUM_WARPS", "MAX_TILES_PER_PROGRAM",
         "NUM_STAGES", "USE_TMA", "TMA_STAGES", "USE_SM90", "SM90_TILES_PER_PROGRAM")
SM90_NAMES = ("NS",)  # `fp8mla.kernels.indexer_sm90`'s, read at each launch
VARIANTS = [  # (label, {constant: value}); the defaults first (the Gluon kernel, session 43)
    ("default", {}),
    ("sm90 tiles 4", dict(SM90_TILES_PER_PROGRAM=4)),
    ("sm90 tiles 16", dict(SM90_TILES_PER_PROGRAM=16)),
    ("sm90 tiles 32", dict(SM90_TILES_PER_PROGRAM=32)),
    ("sm90 3 stages", dict(NS=3)),
    ("sm90 6 stages", dict(NS=6)),
    ("triton kernel (session 6)", dict(USE_SM90=False)),
    ("triton tiles÷2", dict(USE_SM90=False, MAX_TILES_PER_PROGRAM=4)),
    ("default again", {}),
]

ceiling = read_ceiling_tbps()
defaults = {n: getattr(indexer, n) for n in NAMES}
sm90_defaults = {n: getattr(indexer_sm90, n) for n in SM90_NAMES}
results = []
for batch, ctx, heads in ((64, 32768, 32), (64, 32768, 64), (1, 4160, 32)):
    cache, table, q, w, lens = _index_problem(batch, ctx, heads, "cuda", seed=1)
    fn = partial(indexer.indexer_logits_paged, q, w, cache.layer(0), table, lens, max_len=ctx,
                 check=False)
    want = fn()
    for label, over in VARIANTS:
        for n in NAMES:
            setattr(indexer, n, over.get(n, defaults[n]))
        for n in SM90_NAMES:
            setattr(indexer_sm90, n, over.get(n, sm90_defaults[n]))
        try:
            torch.testing.assert_close(fn(), want, rtol=1e-3, atol=1e-3)
            us = time_us(graphed(fn))
        finally:
            for n in NAMES:
                setattr(indexer, n, defaults[n])
            for n in SM90_NAMES:
                setattr(indexer_sm90, n, sm90_defaults[n])
        tbps = batch * ctx * 132 / us / 1e6
        results.append({"batch": batch, "ctx": ctx, "heads": heads, "variant": label, **over,
                        "us": us, "TBps": tbps, "ratio": tbps / ceiling})
        print(f"B{batch} ctx{ctx} H{heads} {label:<26} {us:8.1f} us {tbps:5.2f} TB/s "
              f"({tbps / ceiling:.0%})", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
               "ceiling_TBps": ceiling, "results": results}, f, indent=1)
