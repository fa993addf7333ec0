"""The split merge inside the decode kernel against the combine launch, on a GPU (ABAB).

    python benchmarks/merge_ab.py OUT.json

Plans of 2 to `fp8mla.decode.MERGE_MAX_SPLITS` splits merge their partials in the decode kernel
(the last split program of each request and head block to finish reads the others' partials);
before, a second kernel did (`_combine_splits_kernel`). Prediction: the combine's 2.5–3.5 µs
and one launch gap (~1–2 µs) go, and each program's release-and-count at the end plus the last
one's merge (~1 µs) come: −2 to −4 µs per decode with few splits (B=64 × 8K × 16 heads: 4
splits; sparse B=64 × 8 heads: 4; 64 heads: 2), nothing where plans keep the combine (B=1 ×
128K: 256 splits) or have one split (sparse 128 heads). Each case alternates merge / combine
twice in one process (every run checked against the reference first), one JSON row per run.
"""

from __future__ import annotations

import json
import sys

import fp8mla.decode as decode_mod
from fp8mla.bench.decode import DecodeCase, run_case
from fp8mla.bench.harness import announced_ceiling, env_info
from fp8mla.bench.sparse import run_sparse

DENSE = [(DecodeCase(64, 8192, 16), "fp8"), (DecodeCase(64, 8192, 16), "fp8_ds_mla"),
         (DecodeCase(64, 8192, 16), "bf16"), (DecodeCase(64, 8192, 16, s_q=2), "fp8"),
         (DecodeCase(1, 131072, 8), "fp8")]
SPARSE = [(64, 8, 2048, 1), (64, 64, 2048, 1)]
MODES = {"merge": decode_mod.MERGE_MAX_SPLITS, "combine": 1}


def main() -> int:
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    runs = [(lambda c=c, f=f: run_case(c, f, env, ceiling)[-1]) for c, f in DENSE]
    runs += [(lambda s=s: run_sparse(*s, env, ceiling)[-1]) for s in SPARSE]
    rows = []
    for run in runs:
        for mode in ("merge", "combine", "merge", "combine"):
            decode_mod.MERGE_MAX_SPLITS = MODES[mode]
            try:
                rec = run()
                row = {"case": rec.case, "mode": mode, "us": rec.us, "TBps": rec.TBps,
                       "TFLOPS": rec.TFLOPS, "note": rec.note}
                print(f"{rec.case:<52} {mode:<8} {rec.us:8.1f} us {rec.TBps:5.2f} TB/s",
                      flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row = {"mode": mode, "error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{mode} ERROR {row['error'][:120]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    decode_mod.MERGE_MAX_SPLITS = MODES["merge"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
