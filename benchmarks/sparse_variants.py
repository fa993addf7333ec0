"""Time alternative sparse-decode configurations on a GPU (#4's three sparse cases), each
checked against the reference by `fp8mla.bench.sparse.run_sparse`.

    python benchmarks/sparse_variants.py OUT.json

The launcher's default first, then tile size, heads per program, pipeline depth and split count
variants. One JSON row per (case, variant), written after every row so a run cut short keeps what
it measured. The plan is edited per experiment; session 9 re-timed split counts, 32-head blocks
and 2 vs 3 stages once 64-row programs had lost their ~70-µs fixed cost (defaults stayed best:
`h200-20261130-s9-7dbddb5-sparse-variants.json`), then A/B'd `DecodeConfig.lookahead` and a
dim-order 64-row path (BENCHMARKS.md, session 9). In the plan now: H=8 at 3 stages (measured
inconsistently: −2% in two calls, +7% in a third) and a register cap for three programs per
SM. Offline (sm_90, triton 3.6, sparse fp8_ds_mla): 64 heads × 64 tokens 255 registers, 190 KB
at 2 stages / 231 KB at 3; 32 heads × 64 tokens with 8 warps 233 registers and 83 KB at 2
stages (one program per SM: registers).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace

from decode_variants import patched

from fp8mla.bench.harness import announced_ceiling, by_backend, env_info, script_args
from fp8mla.bench.sparse import run_sparse
from fp8mla.runtime import decode_config

# (batch, heads, topk, s_q), [(label, DecodeConfig overrides, num_splits or None[,
# fp8mla.decode attributes set for the variant]), ...]
# Session 11: converted once (h200-20261201-s11-once-sparse-variants.json: 60.5 → 74–93 µs) and
# 8 warps (s11-2a8cd0b-w8-sparse-variants.json: 60.9 → 89.0), both dropped; split counts and 3
# stages: defaults stay (s11-2a8cd0b-splits-sparse-variants.json). Session 16: the Gluon kernel
# of ≤ 16-head programs (`SPARSE_SM90_NARROW`, the default arm; slower, removed in session 35)
# against the Triton kernel, ABAB, and its split counts
# Session 19: the ≤ 8-row Gluon kernel over fp8_ds_mla lists (`SPARSE_SM90_MMA8`) against the
# Triton kernel at both ring depths, ABAB (s19-e32f025-mma8-sparse-variants.json): B=64 × 8
# heads 48.0 / 48.1 µs at 2 stages, 56.0 / 56.1 at 3, against 60.8 / 61.3; split counts 2 and 8
# slower than the scheduler's 4. Now the default at 2 stages; the plan times it against the
# Triton kernel once more and at 16 heads (not served: the Triton kernel either way)
# Session 24: the ≤ 8-row kernel's first product as FP8 wgmma over the gathered bytes
# (`SPARSE_SM90_MMA8_QK8`) against its mma.sync form (the default arm), ABAB
QK8 = {"SPARSE_SM90_MMA8_QK8": True}
AB = [("fp8 wgmma q·Kᵀ", None, None, QK8), ("default again", None, None, {}),
      ("fp8 wgmma again", None, None, QK8)]
PLAN = [
    ((64, 8, 2048, 1), AB),
    ((128, 8, 2048, 1), AB[:1]),
    ((64, 4, 2048, 2), AB[:1]),
]

def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    rows = []
    for (batch, heads, topk, s_q), extra in PLAN:
        base = decode_config(90, "fp8_ds_mla", heads, 1, sparse=True)
        for label, over, splits, *patch in [("default", None, None)] + extra:
            cfg = None if over is None else replace(base, **over)
            patch = (patch or [{}])[0]
            row = {"batch": batch, "heads": heads, "topk": topk, "s_q": s_q, "variant": label,
                   "config": asdict(cfg) if cfg else None, "splits": splits, "patch": patch}
            try:
                with patched(patch):
                    recs = run_sparse(batch, heads, topk, s_q, env, ceiling, config=cfg,
                                      num_splits=splits)
                rec = by_backend(recs, "fp8mla_graph")
                clean = by_backend(recs, "fp8mla_graph_cleanL2").us
                row.update(case=rec.case, us=rec.us, us_clean_l2=clean, TBps=rec.TBps,
                           TFLOPS=rec.TFLOPS, note=rec.note)
                print(f"{rec.case:<48} {label:<18} {rec.us:8.1f} us (clean L2 {clean:6.1f}) "
                      f"{rec.TBps:5.2f} TB/s {rec.TFLOPS:6.1f} TFLOPS  {rec.note}", flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"B{batch} H{heads} {label:<18} ERROR {row['error'][:120]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
