"""Time alternative decode-kernel configurations on a GPU, each checked against the reference.

    python benchmarks/decode_variants.py OUT.json [--quick]

For every case below: the launcher's default configuration first, then the variants (tile
sizes, warps, pipeline depth, MMA orientation `swap`, single conversion `cvt_once`, split
count). One JSON row per (case, variant) with µs (CUDA-graph replay, median), TB/s, TFLOPS and
the ratio to the streaming-read ceiling measured in the same run. A variant that fails to
compile or to match the reference is recorded with its error, not dropped.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace

from fp8mla.bench.decode import DecodeCase, run_case
from fp8mla.bench.harness import env_info, read_ceiling_tbps
from fp8mla.runtime import decode_config


def variants(case: DecodeCase, fmt: str):
    """(label, config or None for the default, num_splits or None for the scheduler's)."""
    base = decode_config(90, fmt, case.heads, case.s_q)
    yield "default", None, None
    if case.heads <= 16:
        for bn, warps, stages in ((64, 4, 2), (64, 4, 3), (128, 8, 2)):
            cfg = replace(base, block_n=bn, num_warps=warps, num_stages=stages, swap=True)
            yield f"swap bn{bn} w{warps} s{stages}", cfg, None
            if fmt != "bf16" and (bn, warps, stages) in ((64, 4, 2), (128, 8, 2)):
                yield (f"swap+once bn{bn} w{warps} s{stages}",
                       replace(cfg, cvt_once=True), None)
        if fmt != "bf16":
            yield "once", replace(base, cvt_once=True), None
        if case.batch == 1:
            for splits in (66, 132, 512):
                yield f"swap bn64 w4 s2 splits{splits}", replace(
                    base, block_n=64, num_warps=4, num_stages=2, swap=True), splits
    else:
        for heads, bn, warps in ((64, 64, 8), (32, 64, 4), (32, 128, 8), (16, 128, 8)):
            cfg = replace(base, heads_per_block=heads, block_n=bn, num_warps=warps, swap=True)
            yield f"swap h{heads} bn{bn} w{warps}", cfg, None
            if fmt != "bf16":
                yield f"swap+once h{heads} bn{bn} w{warps}", replace(cfg, cvt_once=True), None
        yield "default bn64", replace(base, block_n=64), None


CASES = [
    (DecodeCase(64, 8192, 16), "fp8"),
    (DecodeCase(1, 131072, 8), "fp8"),
    (DecodeCase(64, 8192, 128), "fp8"),
    (DecodeCase(64, 8192, 16), "fp8_ds_mla"),
    (DecodeCase(64, 8192, 16), "bf16"),
]


def main() -> int:
    out_path = sys.argv[1]
    quick = "--quick" in sys.argv
    env = env_info()
    ceiling = read_ceiling_tbps()
    print(f"{env['gpu']} triton {env['triton']} ceiling {ceiling:.2f} TB/s", flush=True)
    rows = []
    for case, fmt in CASES[:2] if quick else CASES:
        for label, cfg, splits in variants(case, fmt):
            row = {"case": case.name(f"dense_decode/{fmt}", fmt), "variant": label,
                   "config": asdict(cfg) if cfg else None, "splits": splits}
            try:
                rec = run_case(case, fmt, env, ceiling, config=cfg, num_splits=splits)[-1]
                row.update(us=rec.us, TBps=rec.TBps, TFLOPS=rec.TFLOPS,
                           ratio=round(rec.TBps / ceiling, 3), note=rec.note)
                print(f"{row['case']:<42} {label:<28} {rec.us:8.1f} us {rec.TBps:5.2f} TB/s "
                      f"{rec.TFLOPS:6.1f} TFLOPS", flush=True)
            except Exception as e:  # noqa: BLE001 — record and go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{row['case']:<42} {label:<28} ERROR {row['error'][:120]}", flush=True)
            rows.append(row)
            with open(out_path, "w") as f:  # after every row: a run cut short keeps its rows
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
