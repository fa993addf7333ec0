"""Why does `fp8mla bench sparse`'s first indexer row read slower since session 12?

    python benchmarks/indexer_after_sparse.py OUT.json      (GPU, ~2 minutes)

Session 12 (BENCHMARKS.md): since sparse plans of 64-row programs compact their index lists,
the first indexer row of `fp8mla bench sparse` (B=64 × 32K, 32 index heads, eager) reads
110.6–114.9 µs against 86.0–86.2 before, while the same kernel replayed from a CUDA graph in
the same runs is unchanged (85.7–86.2). The indexer's code did not change. This times that row
(eager and graphed) in one process: first on its own, then after the sparse cases with the
compaction (the default), after `torch.cuda.empty_cache()`, and after the sparse cases with
every list checked per entry instead (`fp8mla.sparse.COMPACT_MIN_ROWS`). JSON rows as it goes.
"""

from __future__ import annotations

import json
import sys

import torch

import fp8mla.sparse as sparse_mod
from fp8mla.bench import sparse as bench
from fp8mla.bench.harness import announced_ceiling, env_info, time_us


def indexer_row(env, ceiling, stage: str, device: str = "cuda") -> dict:
    """The 32-head indexer case as `bench sparse` times it (eager, checked first), and the
    same call replayed from a CUDA graph."""
    from fp8mla.indexer import indexer_logits_paged

    rec = bench.run_indexer_topk(env, ceiling, device=device,
                                 indexer_cases=bench.INDEXER_CASES[:1], topk_cases=[])[0]
    batch, ctx, heads = bench.INDEXER_CASES[0]
    cache, table, q, w, lens = bench._index_problem(batch, ctx, heads, device)
    fn = lambda: indexer_logits_paged(q, w, cache.layer(0), table, lens,  # noqa: E731
                                      max_len=ctx, check=False)
    return {"stage": stage, "case": rec.case, "eager_us": rec.us,
            "graph_us": round(time_us(bench._timed(fn, device)), 2)}


def main() -> int:
    env = env_info()
    ceiling = announced_ceiling(env)
    rows = []

    def step(stage):
        rows.append(indexer_row(env, ceiling, stage))
        print(rows[-1], flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)

    step("alone")
    for case in bench.SPARSE_CASES:
        bench.run_sparse(*case, env, ceiling)
    step("after the sparse cases (compacted lists)")
    torch.cuda.empty_cache()
    step("after torch.cuda.empty_cache()")
    sparse_mod.COMPACT_MIN_ROWS = 1 << 30
    for case in bench.SPARSE_CASES:
        bench.run_sparse(*case, env, ceiling)
    step("after the sparse cases (every entry checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
