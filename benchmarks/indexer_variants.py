"""Indexer logits: the launcher's module constants varied one set at a time (TMA copies or
pointer loads with register prefetch or the compiler's pipeline, warps, tiles per program,
pipeline stages) on the benchmark's rows (B=64, ctx 32K, 32 and 64 index heads) and the
demo's (B=1, 4160), graph-timed in one run with the read ceiling; every variant checked against
the defaults' output (bit for bit where it sums in the same order).

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

NAMES = ("PREFETCH_MIN_HEADS", "KEYS_AS_ROWS", "BLOCK_S", "NUM_WARPS", "MAX_TILES_PER_PROGRAM",
         "NUM_STAGES", "USE_TMA", "TMA_STAGES")
ON, OFF = 0, 1 << 30  # PREFETCH_MIN_HEADS: prefetch at every head count / at none
VARIANTS = [  # (label, {constant: value}); the defaults first (TMA copies, session 6)
    ("default", {}),
    ("tma 2 stages", dict(TMA_STAGES=2)),
    ("tma 4 stages", dict(TMA_STAGES=4)),
    ("tma tiles×2", dict(MAX_TILES_PER_PROGRAM=16)),  # 64 tiles from 64 heads
    ("tma tiles÷2", dict(MAX_TILES_PER_PROGRAM=4)),
    ("pointers (session 5)", dict(USE_TMA=False)),
    ("pointers pipelined", dict(USE_TMA=False, PREFETCH_MIN_HEADS=OFF)),
    ("pointers prefetch", dict(USE_TMA=False, PREFETCH_MIN_HEADS=ON)),
]

ceiling = read_ceiling_tbps()
defaults = {n: getattr(indexer, n) for n in NAMES}
results = []
for batch, ctx, heads in ((64, 32768, 32), (64, 32768, 64), (1, 4160, 32)):
    cache, table, q, w, lens = _index_problem(batch, ctx, heads, "cuda", seed=1)
    fn = partial(indexer.indexer_logits_paged, q, w, cache.layer(0), table, lens, max_len=ctx,
                 check=False)
    want = fn()
    for label, over in VARIANTS:
        for n in NAMES:
            setattr(indexer, n, over.get(n, defaults[n]))
        try:
            torch.testing.assert_close(fn(), want, rtol=1e-5, atol=1e-5)
            us = time_us(graphed(fn))
        finally:
            for n in NAMES:
                setattr(indexer, n, defaults[n])
        tbps = batch * ctx * 132 / us / 1e6
        results.append({"batch": batch, "ctx": ctx, "heads": heads, "variant": label, **over,
                        "us": us, "TBps": tbps, "ratio": tbps / ceiling})
        print(f"B{batch} ctx{ctx} H{heads} {label:<26} {us:8.1f} us {tbps:5.2f} TB/s "
              f"({tbps / ceiling:.0%})", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
               "ceiling_TBps": ceiling, "results": results}, f, indent=1)
