"""Indexer logits: key tiles per program × pipeline stages, on the benchmark's rows (B=64,
ctx 32K, 32 and 64 index heads) and the demo's (B=1, 4160), graph-timed in one run with the
read ceiling; every variant checked against the default's output.

    python benchmarks/indexer_variants.py OUT.json
"""

import json
import sys

import torch

from fp8mla import indexer
from fp8mla.bench.harness import graphed, read_ceiling_tbps, time_us
from fp8mla.bench.sparse import _index_problem

ceiling = read_ceiling_tbps()
DEFAULTS = indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES
results = []
for batch, ctx, heads in ((64, 32768, 32), (64, 32768, 64), (1, 4160, 32)):
    cache, table, q, w, lens = _index_problem(batch, ctx, heads, "cuda", seed=1)
    fn = lambda: indexer.indexer_logits_paged(q, w, cache.layer(0), table, lens,  # noqa: E731
                                              max_len=ctx, check=False)
    indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES = DEFAULTS
    want = fn()  # the defaults' output: every variant must match it bit for bit
    for tiles in (1, 2, 4, 8, 16):
        for stages in (2, 3, 4):
            indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES = tiles, stages
            assert torch.equal(fn(), want), (tiles, stages)
            us = time_us(graphed(fn))
            tbps = batch * ctx * 132 / us / 1e6
            results.append({"batch": batch, "ctx": ctx, "heads": heads, "max_tiles": tiles,
                            "stages": stages, "us": us, "TBps": tbps,
                            "ratio": tbps / ceiling})
            print(f"B{batch} ctx{ctx} H{heads} tiles<={tiles} stages {stages}: {us:8.1f} us "
                  f"{tbps:5.2f} TB/s ({tbps / ceiling:.0%})", flush=True)
indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES = DEFAULTS
with open(sys.argv[1], "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "ceiling_TBps": ceiling, "results": results}, f, indent=1)
