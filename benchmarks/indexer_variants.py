"""Indexer logits: register prefetch × score orientation × tiles per program × pipeline
stages, on the benchmark's rows (B=64, ctx 32K, 32 and 64 index heads) and the demo's (B=1, 4160),
graph-timed in one run with the read ceiling; every variant checked against the default's
output (bit for bit within an orientation; the two orientations sum in different orders).

    python benchmarks/indexer_variants.py OUT.json
"""

import itertools
import json
import sys
from functools import partial

import torch

from fp8mla import indexer
from fp8mla.bench.harness import graphed, read_ceiling_tbps, time_us
from fp8mla.bench.sparse import _index_problem

ceiling = read_ceiling_tbps()
DEFAULTS = (indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES, indexer.KEYS_AS_ROWS,
            indexer.PREFETCH_MIN_HEADS)
results = []
for batch, ctx, heads in ((64, 32768, 32), (64, 32768, 64), (1, 4160, 32)):
    cache, table, q, w, lens = _index_problem(batch, ctx, heads, "cuda", seed=1)
    fn = partial(indexer.indexer_logits_paged, q, w, cache.layer(0), table, lens, max_len=ctx,
                 check=False)
    (indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES, indexer.KEYS_AS_ROWS,
     indexer.PREFETCH_MIN_HEADS) = DEFAULTS
    want = fn()  # the defaults' output: every variant must match it bit for bit
    for prefetch, rows_keys, tiles, stages in itertools.product((True, False), (True, False),
                                                                 (1, 4, 8, 16), (2, 3)):
        if prefetch and stages != 2:
            continue  # the prefetching loop is not pipelined by the compiler
        indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES = tiles, stages
        indexer.KEYS_AS_ROWS = rows_keys
        indexer.PREFETCH_MIN_HEADS = 0 if prefetch else 1 << 30
        got = fn()
        if rows_keys == DEFAULTS[2] and prefetch == (heads >= DEFAULTS[3]):
            assert torch.equal(got, want), (rows_keys, tiles, stages)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        us = time_us(graphed(fn))
        tbps = batch * ctx * 132 / us / 1e6
        results.append({"batch": batch, "ctx": ctx, "heads": heads, "prefetch": prefetch,
                        "keys_as_rows": rows_keys, "max_tiles": tiles, "stages": stages, "us": us, "TBps": tbps,
                        "ratio": tbps / ceiling})
        print(f"B{batch} ctx{ctx} H{heads} {'[keys, heads]' if rows_keys else '[heads, keys]'} "
              f"{'prefetch ' if prefetch else ''}tiles<={tiles} stages {stages}: {us:8.1f} us {tbps:5.2f} TB/s "
              f"({tbps / ceiling:.0%})", flush=True)
(indexer.MAX_TILES_PER_PROGRAM, indexer.NUM_STAGES, indexer.KEYS_AS_ROWS,
 indexer.PREFETCH_MIN_HEADS) = DEFAULTS
with open(sys.argv[1], "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "ceiling_TBps": ceiling, "results": results}, f, indent=1)
