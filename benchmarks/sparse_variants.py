"""Time alternative sparse-decode configurations on a GPU (#4's three sparse cases), each
checked against the reference by `fp8mla.bench.sparse.run_sparse`.

    python benchmarks/sparse_variants.py OUT.json

The launcher's default first, then tile size, heads per program, pipeline depth and split count
variants. One JSON row per (case, variant), written after every row so a run cut short keeps what
it measured. Why these: until session 8 every 64-row program paid ~70 µs of 2-byte q / out moves
(a one-tile program took 78 µs), which made more splits look ruinous (s5: B=64 H=64 2 → 4 → 8
splits 214 → 337 → 503 µs) and favoured few long programs; with that gone (one-tile program
17.7 µs; B=64 H=64 130.5 µs at 2 splits, 3 stages with carried slots) the split, head-block and
stage choices are worth timing again. Offline (sm_90, triton 3.6, sparse fp8_ds_mla): 64 heads ×
64 tokens 255 registers, 190 KB at 2 stages / 231 KB at 3; 32 heads × 64 tokens with 8 warps 233
registers and 83 KB at 2 stages, 216 and 125 KB at 3 (one program per SM either way: registers).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace

from fp8mla.bench.harness import env_info, read_ceiling_tbps
from fp8mla.bench.sparse import run_sparse
from fp8mla.runtime import decode_config

# (batch, heads, topk, s_q), [(label, DecodeConfig overrides, num_splits or None), ...]
PLAN = [  # session 9: the index check is one unsigned compare (fewer instructions, spills)
    ((64, 8, 2048, 1), [("stages3", dict(num_stages=3), None)]),
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
