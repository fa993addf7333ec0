"""Run one decode configuration a few times (for `ncu`): the last launch is the one to profile.

    ncu -k regex:_mla_decode --launch-skip 2 --launch-count 1 \
        python benchmarks/profile_decode.py FMT BATCH CTX HEADS [key=value ...]

key=value pairs override fields of the launcher's DecodeConfig (block_n, num_warps, swap, ...)
and, as splits=N, the split count.
"""

import sys
from dataclasses import fields, replace

from fp8mla.bench.decode import DecodeCase, make_problem
from fp8mla.decode import DecodePlan
from fp8mla.runtime import DecodeConfig, decode_config

fmt_name, batch, ctx, heads = sys.argv[1], *map(int, sys.argv[2:5])
types = {f.name: f.type for f in fields(DecodeConfig)}
over, splits = {}, None
for kv in sys.argv[5:]:
    k, v = kv.split("=")
    if k == "splits":
        splits = int(v)
    else:
        over[k] = v in ("1", "True", "true") if types[k] in (bool, "bool") else int(v)
case = DecodeCase(batch, ctx, heads)
fmt, rows, table, seqlens, q, scale = make_problem(case, fmt_name)
cfg = replace(decode_config(90, fmt_name, heads, 1), **over)
plan = DecodePlan(batch=batch, num_heads=heads, kv_format=fmt, page_size=case.page_size,
                  cache_seqlens=seqlens, device="cuda", config=cfg, num_splits=splits)
for _ in range(3):
    plan.run(q, rows, table, seqlens, fp8_scale=scale, check=False)
print("profiled", fmt_name, batch, ctx, heads, cfg, "splits", plan.num_splits)
