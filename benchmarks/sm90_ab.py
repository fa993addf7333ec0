"""The Gluon SM90 decode kernels against the Triton kernel through the launcher, on a GPU
(ABAB).

    python benchmarks/sm90_ab.py OUT.json [--sparse] [--cases N]

`fp8mla.decode.SM90_GLUON` switches fp8 64-head programs between `fp8mla.kernels.decode_sm90`
(q · Kᵀ split across the two warpgroups) and `_mla_decode_kernel` (both warpgroups compute it).
`--sparse`: the same for sparse decode (`SPARSE_SM90_GLUON`). New variants go in as arms (the
module switches each arm sets; session 15's — the old ring layout, lists compacted first — are
at bb2dfd3, the old gather layout at a6cb0db). Each case (the first N) is checked against the
reference, then replayed from a CUDA graph, the arms alternating twice in one process. The
experiment that led to it (a standalone Gluon kernel, benchmarks/gluon_decode.py at 3b54348):
B=64 × 8K × 128 heads 538.4 → 455.9 µs, B=128 × 2K 285.7 → 248.6
(h200-20261201-s13-gluon-decode.json).
"""

from __future__ import annotations

import json
import sys

import fp8mla.decode as decode_mod
from fp8mla.bench.decode import DecodeCase, run_case
from fp8mla.bench.harness import announced_ceiling, by_backend, env_info, script_args

CASES = [DecodeCase(64, 8192, 128), DecodeCase(128, 2048, 128), DecodeCase(64, 8192, 64),
         DecodeCase(1, 131072, 128), DecodeCase(64, 8192, 128, page_size=256),
         DecodeCase(64, 8190, 100)]


SPARSE_CASES = [(128, 128, 2048, 1), (64, 64, 2048, 1)]
# arms: the fp8mla.decode switches each sets
DENSE_ARMS = {"gluon": {"SM90_GLUON": True}, "triton": {"SM90_GLUON": False}}
SPARSE_ARMS = {"gluon": {"SPARSE_SM90_GLUON": True}, "triton": {"SPARSE_SM90_GLUON": False}}


def _ab(cases, arms, run, out_path, env, ceiling) -> None:
    """Every case under every arm, the arms alternating twice; each run checked against the
    reference by ``run`` first. JSON rewritten after every row; the switches restored."""
    base = {k: getattr(decode_mod, k) for arm in arms.values() for k in arm}
    rows = []
    for case in cases:
        for mode in [*arms, *arms]:
            for k, v in arms[mode].items():
                setattr(decode_mod, k, v)
            try:
                rec = run(case)
                row = {"case": rec.case, "kernel": mode, "us": rec.us, "TBps": rec.TBps,
                       "TFLOPS": rec.TFLOPS, "note": rec.note}
                print(f"{rec.case:<48} {mode:<10} {rec.us:8.1f} us {rec.TFLOPS:6.1f} TFLOPS",
                      flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row = {"case": str(case), "kernel": mode, "error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{case} {mode} ERROR {row['error'][:200]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    for k, v in base.items():
        setattr(decode_mod, k, v)


def main() -> int:
    script_args(__doc__)
    env = env_info()
    ceiling = announced_ceiling(env)
    n = int(sys.argv[sys.argv.index("--cases") + 1]) if "--cases" in sys.argv else None
    if "--sparse" in sys.argv:  # the Gluon arms at every case's head count
        from fp8mla.bench.sparse import run_sparse

        min_heads = decode_mod.SPARSE_SM90_MIN_HEADS
        decode_mod.SPARSE_SM90_MIN_HEADS = 64
        _ab(SPARSE_CASES[:n], SPARSE_ARMS,
            lambda c: by_backend(run_sparse(*c, env, ceiling), "fp8mla_graph"), sys.argv[1], env,
            ceiling)
        decode_mod.SPARSE_SM90_MIN_HEADS = min_heads
    else:
        _ab(CASES[:n], DENSE_ARMS,
            lambda c: by_backend(run_case(c, "fp8", env, ceiling), "fp8mla_graph"), sys.argv[1],
            env, ceiling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
