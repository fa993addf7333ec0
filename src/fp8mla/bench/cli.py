"""``fp8mla bench decode``: time dense decode (and dense prefill) on this GPU against its read
ceiling.

Writes docs/DESIGN.md §9 records (JSON) and prints µs, TB/s, TFLOPS and the ratio to the
ceiling per case. ``--sweep`` also times alternative tile/split configurations and prints the best.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark kernels on this GPU (JSON results)")
    p.add_argument("what", choices=["decode", "sparse"], metavar="{decode,sparse}",
                   help="decode: dense decode, dense prefill + the pool case; sparse: sparse "
                        "decode, indexer, top-k")
    p.add_argument("--out", default=None,
                   help="JSON path (default benchmarks/results/<gpu>-<yyyymmdd>.json)")
    p.add_argument("--formats", default="fp8,fp8_ds_mla,bf16",
                   help="comma-separated KV formats (default: fp8,fp8_ds_mla,bf16)")
    p.add_argument("--sweep", action="store_true", help="also time other configurations")
    p.add_argument("--cases", default="all", choices=["all", "pool"],
                   help="all cases, or only the motivating pool case")
    p.add_argument("--sweep-out", default=None, help="JSON path for the sweep's rows")
    p.set_defaults(func=run)


def _progress(items, desc):
    try:
        from tqdm import tqdm
        return tqdm(items, desc=desc, file=sys.stderr)
    except ImportError:
        return items


def _print(rec) -> None:
    ratio = f"{rec.TBps / rec.ceiling_TBps:6.1%}" if rec.TBps else "   -  "
    tflops = f"{rec.TFLOPS:7.1f}" if rec.TFLOPS is not None else "      -"
    print(f"{rec.case:48s} {rec.backend:20s} {rec.us:9.1f} us {rec.TBps or 0:6.2f} TB/s "
          f"{tflops} TFLOPS  {ratio} of ceiling", flush=True)


def _print_floor_ratio(records) -> None:
    """One case's fp8mla graph replays against its floor under the same timer: "at N% of the
    floor's rate" (each TB/s on the bytes it moves), where the case has floor rows."""
    rates = {r.backend: r.TBps for r in records}
    for timer in ("", "_cleanL2"):
        floor = rates.get(f"read_floor{timer}") or rates.get(f"gather_floor{timer}")
        tbps = rates.get(f"fp8mla_graph{timer}")
        if floor and tbps:
            print(f"{'':48s} fp8mla_graph{timer} at {tbps / floor:.0%} of the floor's rate",
                  flush=True)


def _sweep(case, fmt, env, ceiling):
    from fp8mla.bench.decode import run_case
    from fp8mla.bench.harness import by_backend
    from fp8mla.runtime import DecodeConfig, decode_config

    base = decode_config(90, fmt, case.heads, case.s_q)
    rows = []
    for bn, warps, stages in itertools.product((32, 64), (4, 8), (2, 3)):
        cfg = DecodeConfig(block_n=bn, heads_per_block=base.heads_per_block, num_warps=warps,
                           num_stages=stages, words_2d=base.words_2d, lookahead=base.lookahead)
        try:
            rec = by_backend(run_case(case, fmt, env, ceiling, config=cfg), "fp8mla_graph")
        except Exception as e:  # a configuration that does not compile or fit: record it
            rows.append({"case": case.name("dense_decode/" + fmt, fmt), "config": str(cfg),
                         "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        rows.append({"case": rec.case, "us": rec.us, "TBps": rec.TBps, "TFLOPS": rec.TFLOPS,
                     "note": rec.note})
    ok = [r for r in rows if "us" in r]
    if ok:
        best = min(ok, key=lambda r: r["us"])
        print(f"  best: {best['us']} us {best['TBps']} TB/s  {best['note']}", flush=True)
    return rows


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("fp8mla bench: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    from fp8mla.bench.decode import DECODE_CASES, POOL_CASE, run_case
    from fp8mla.bench.harness import env_info, read_ceiling_tbps, write_records
    from fp8mla.bench.prefill import PREFILL_CASES, RAGGED_CASES, run_prefill, run_ragged_prefill

    env = env_info()
    ceiling = read_ceiling_tbps()
    print(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}  read ceiling "
          f"{ceiling:.2f} TB/s", flush=True)
    gpu = env["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    default_path = os.path.join("benchmarks", "results",
                                f"{gpu}-{env['date'].replace('-', '')}-{args.what}.json")
    if args.what == "sparse":
        return _run_sparse(args, env, ceiling, args.out or default_path)
    records, sweep_rows = [], []
    formats = [f for f in args.formats.split(",") if f]
    jobs = [(c, f) for f in formats for c in DECODE_CASES] if args.cases == "all" else []
    for case, fmt in _progress(jobs, "decode"):
        recs = run_case(case, fmt, env, ceiling, floor=True)
        for rec in recs:
            records.append(rec)
            _print(rec)
        _print_floor_ratio(recs)
        if args.sweep and case.heads < 64:
            sweep_rows += _sweep(case, fmt, env, ceiling)
    if args.cases == "all" and "fp8" in formats:
        for case in _progress(PREFILL_CASES, "prefill"):
            for rec in run_prefill(case, "fp8", env, ceiling):
                records.append(rec)
                _print(rec)
        for case in _progress(RAGGED_CASES, "ragged prefill"):
            for rec in run_ragged_prefill(case, "fp8", env, ceiling):
                records.append(rec)
                _print(rec)
    for rec in run_case(POOL_CASE, "fp8", env, ceiling,
                        backends=("fp8mla", "gather_cast", "full_cast"),
                        kind="pool_cast/one_layer"):
        records.append(rec)
        _print(rec)
    path = args.out or default_path
    write_records(records, path)
    print(f"wrote {path}")
    if args.sweep and args.sweep_out:
        with open(args.sweep_out, "w") as f:
            json.dump(sweep_rows, f, indent=1)
    return 0


def _run_sparse(args, env, ceiling, path) -> int:
    from fp8mla.bench.harness import write_records
    from fp8mla.bench.sparse import PREFILL_CASES, SPARSE_CASES, run_indexer_topk, run_sparse

    records = []
    for batch, heads, topk, s_q in _progress(SPARSE_CASES, "sparse"):
        recs = run_sparse(batch, heads, topk, s_q, env, ceiling, floor=True)
        for rec in recs:
            records.append(rec)
            _print(rec)
        _print_floor_ratio(recs)
    for tokens, heads, topk in _progress(PREFILL_CASES, "prefill"):
        for rec in run_sparse(tokens, heads, topk, 1, env, ceiling, prefill=True):
            records.append(rec)
            _print(rec)
    for rec in run_indexer_topk(env, ceiling):
        records.append(rec)
        _print(rec)
    write_records(records, path)
    print(f"wrote {path}")
    return 0
