"""The Gluon SM90 decode kernel against the Triton kernel through the launcher, on a GPU (ABAB).

    python benchmarks/sm90_ab.py OUT.json [--sparse] [--cases N]

`fp8mla.decode.SM90_GLUON` switches fp8 64-head programs between `fp8mla.kernels.decode_sm90`
(q · Kᵀ split across the two warpgroups) and `_mla_decode_kernel` (both warpgroups compute it).
Each case (the first N) is checked against the reference by `run_case`, then replayed from a
CUDA graph, the two kernels alternating twice in one process. The experiment that led to it (a standalone
Gluon kernel, benchmarks/gluon_decode.py at 3b54348): B=64 × 8K × 128 heads 538.4 → 455.9 µs,
B=128 × 2K 285.7 → 248.6 (h200-20261201-s13-gluon-decode.json).
"""

from __future__ import annotations

import json
import sys

import fp8mla.decode as decode_mod
from fp8mla.bench.decode import DecodeCase, run_case
from fp8mla.bench.harness import announced_ceiling, env_info

CASES = [DecodeCase(64, 8192, 128), DecodeCase(128, 2048, 128), DecodeCase(64, 8192, 64),
         DecodeCase(1, 131072, 128), DecodeCase(64, 8192, 128, page_size=256),
         DecodeCase(64, 8190, 100)]


SPARSE_CASES = [(128, 128, 2048, 1), (64, 64, 2048, 1)]


def sparse_ab(env, ceiling, rows, out_path) -> None:
    """The same A/B for sparse decode over compacted lists (`SPARSE_SM90_GLUON`); the Gluon arm
    is taken at every case's head count (`SPARSE_SM90_MIN_HEADS` lowered to 64)."""
    from fp8mla.bench.sparse import run_sparse

    min_heads = decode_mod.SPARSE_SM90_MIN_HEADS
    decode_mod.SPARSE_SM90_MIN_HEADS = 64
    for case in SPARSE_CASES:
        for mode in ("gluon", "triton", "gluon", "triton"):
            decode_mod.SPARSE_SM90_GLUON = mode == "gluon"
            try:
                rec = run_sparse(*case, env, ceiling)[-1]
                row = {"case": rec.case, "kernel": mode, "us": rec.us, "TFLOPS": rec.TFLOPS}
                print(f"{rec.case:<48} {mode:<7} {rec.us:8.1f} us {rec.TFLOPS:6.1f} TFLOPS",
                      flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row = {"case": str(case), "kernel": mode, "error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{case} {mode} ERROR {row['error'][:200]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    decode_mod.SPARSE_SM90_GLUON = True
    decode_mod.SPARSE_SM90_MIN_HEADS = min_heads


def main() -> int:
    env = env_info()
    ceiling = announced_ceiling(env)
    rows = []
    if "--sparse" in sys.argv:
        sparse_ab(env, ceiling, rows, sys.argv[1])
        return 0
    cases = CASES[:int(sys.argv[sys.argv.index("--cases") + 1])] if "--cases" in sys.argv else CASES
    for case in cases:
        for mode in ("gluon", "triton", "gluon", "triton"):
            decode_mod.SM90_GLUON = mode == "gluon"
            try:
                rec = run_case(case, "fp8", env, ceiling)[-1]
                row = {"case": rec.case, "kernel": mode, "us": rec.us, "TBps": rec.TBps,
                       "TFLOPS": rec.TFLOPS, "note": rec.note}
                print(f"{rec.case:<48} {mode:<7} {rec.us:8.1f} us {rec.TFLOPS:6.1f} TFLOPS",
                      flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row = {"case": case.name("dense_decode/fp8", "fp8"), "kernel": mode,
                       "error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{row['case']} {mode} ERROR {row['error'][:150]}", flush=True)
            rows.append(row)
            with open(sys.argv[1], "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    decode_mod.SM90_GLUON = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
