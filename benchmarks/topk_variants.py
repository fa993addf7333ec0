"""Time top-k launch shapes on a GPU (graph replays, median), each checked against a stable sort.

    python benchmarks/topk_variants.py OUT.json [--default | --chunks]

(--default: the defaults only; --chunks: the chunked path's logits per program at every row
length, `fp8mla.topk.CHUNK_SHORT` and `CHUNK` both 1024 / 2048 / 4096, twice each in turn, over
CHUNK_CASES.)

B=64 rows of indexer logits (32K, 16K, 128K), k = 2048: the launcher's defaults, then the
finishing program's warps (`fp8mla.topk.FINISH_KEYS_PER_WARP`) and the sampled threshold's
size and warps (`SAMPLES`, `SAMPLE_WARPS`; rows ≤ 16 k only). Session 7 (H200): 32K default
45.4 µs, finish with 4 warps 49.3, 16 warps 45.1, sample with 4 warps 45.8, 2048 samples 55.9
(`benchmarks/results/h200-20261129-s7-topk-variants.json`).
"""

import json
import sys
from functools import partial

import torch

from fp8mla import topk
from fp8mla.bench.harness import env_info, graphed, read_ceiling_tbps, script_args, time_us
from fp8mla.bench.sparse import _index_problem, topk_reference
from fp8mla.indexer import indexer_logits_paged

VARIANTS = [("default", {}), ("finish w4", {"FINISH_KEYS_PER_WARP": 1024}),
            ("finish w16", {"FINISH_KEYS_PER_WARP": 256}), ("sample w4", {"SAMPLE_WARPS": 4}),
            ("sample 2048", {"SAMPLES": 2048}),
            ("sample 2048 w4", {"SAMPLES": 2048, "SAMPLE_WARPS": 4})]
# session 20: which chunk size where (s20-ed14654-topk-chunks.json: 1024 up to 32K, 2048
# beyond, now `fp8mla.topk.default_chunk`)
CHUNKS = [(f"chunk {c}{again}", {"CHUNK": c, "CHUNK_SHORT": c}) for again in ("", " again")
          for c in (1024, 2048, 4096)]
CHUNK_CASES = ((64, 16384), (64, 32768), (64, 65536), (64, 131072), (16, 32768), (16, 131072),
               (16, 262144), (128, 32768), (256, 16384))


def main() -> int:
    script_args(__doc__)
    rows_out = []
    env = {**env_info(), "ceiling_TBps": read_ceiling_tbps()}
    chunks = "--chunks" in sys.argv
    cases = CHUNK_CASES if chunks else ((64, 32768), (64, 16384), (64, 131072))
    for rows, length in cases:
        cache, table, q, w, lens = _index_problem(rows, length, 32, "cuda", seed=1)
        logits = indexer_logits_paged(q, w, cache.layer(0), table, lens, max_len=length,
                                      check=False)
        ref = topk_reference(logits, 2048)
        plan = CHUNKS if chunks else VARIANTS[:1] if "--default" in sys.argv else VARIANTS
        for label, patch in plan:
            if label.startswith("sample") and not topk.sampled(length, 2048):
                continue
            saved = {k: getattr(topk, k) for k in patch}
            try:
                for k, v in patch.items():
                    setattr(topk, k, v)
                fn = partial(topk.topk_indices, logits, 2048)
                ok = torch.equal(fn().sort(1).values, ref)
                us = time_us(graphed(fn))
            finally:
                for k, v in saved.items():
                    setattr(topk, k, v)
            rows_out.append(dict(rows=rows, length=length, variant=label, us=round(us, 2), ok=ok))
            print(rows_out[-1], flush=True)
            with open(sys.argv[1], "w") as f:  # after every row: a run cut short keeps its rows
                json.dump({**env, "results": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
