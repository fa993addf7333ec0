"""Time alternative sparse-decode configurations on a GPU (#4's three sparse cases), each
checked against the reference by `fp8mla.bench.sparse.run_sparse`.

    python benchmarks/sparse_variants.py OUT.json

The launcher's default first, then tile size, heads per program, pipeline depth and split count
variants. Why: at B=64 H=64 the default (64 heads per program, 189 KB of shared memory) holds
one program per SM with 2 splits = 128 programs, each walking 16 gathered 64-row tiles at
≈ 13 µs per tile (215 µs; FlashMLA 81 µs) — latency, not bandwidth or MMA, bounds it. One JSON
row per (case, variant), written after every row so a run cut short keeps what it measured.
Offline (sm_90, triton 3.6, `sass_decode.py fp8_ds_mla HEADS BLOCK_N STAGES 0 WARPS`): 32 heads
× 64 tokens with 8 warps fits 190 registers and 83 KB (two programs per SM; with 4 warps it
spills), 64 × 32 with 8 warps 229 registers and 132 KB.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace

from fp8mla.bench.harness import env_info, read_ceiling_tbps
from fp8mla.bench.sparse import run_sparse
from fp8mla.runtime import decode_config

# (batch, heads, topk, s_q), [(label, DecodeConfig overrides, num_splits or None), ...]
PLAN = [  # (B=64 H=64: splits 4/8/16, bn32, h32/h16 blocks, stages 1/3 measured slower in s5)
    ((64, 8, 2048, 1), [
        ("nofold", dict(fold_scales=False), None), ("stages3", dict(num_stages=3), None),
        ("nofold stages3", dict(fold_scales=False, num_stages=3), None),
        ("splits8", {}, 8), ("bn32", dict(block_n=32), None),
    ]),
    ((128, 128, 2048, 1), [
        ("splits2", {}, 2), ("bn32", dict(block_n=32), None), ("stages1", dict(num_stages=1), None),
        ("h32 w8", dict(heads_per_block=32, num_warps=8), None),
    ]),
    ((64, 64, 2048, 1), [("stages3", dict(num_stages=3), None)]),
]


def main() -> int:
    out_path = sys.argv[1]
    env = env_info()
    ceiling = read_ceiling_tbps()
    print(f"{env['gpu']} triton {env['triton']} ceiling {ceiling:.2f} TB/s", flush=True)
    rows = []
    for (batch, heads, topk, s_q), extra in PLAN:
        base = decode_config(90, "fp8_ds_mla", heads, 1, sparse=True)
        for label, over, splits in [("default", None, None)] + extra:
            cfg = None if over is None else replace(base, **over)
            row = {"batch": batch, "heads": heads, "topk": topk, "s_q": s_q, "variant": label,
                   "config": asdict(cfg) if cfg else None, "splits": splits}
            try:
                rec = run_sparse(batch, heads, topk, s_q, env, ceiling, config=cfg,
                                 num_splits=splits)[-1]
                row.update(case=rec.case, us=rec.us, TBps=rec.TBps, TFLOPS=rec.TFLOPS,
                           note=rec.note)
                print(f"{rec.case:<48} {label:<18} {rec.us:8.1f} us {rec.TBps:5.2f} TB/s "
                      f"{rec.TFLOPS:6.1f} TFLOPS  {rec.note}", flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"B{batch} H{heads} {label:<18} ERROR {row['error'][:120]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
