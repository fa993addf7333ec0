"""Run one sparse-decode configuration a few times (for `ncu`): the last launch is the one to
profile.

    NCU_DRIVER=benchmarks/profile_sparse.py bash benchmarks/ncu_decode.sh OUT BATCH HEADS \
        [pool=SLOTS] [topk=K] [key=value ...]

fp8_ds_mla rows, random indices over a pool of ``pool`` slots (default: the benchmark's 1M);
other key=value pairs override fields of the launcher's DecodeConfig (none: the launcher's own
choice, the Gluon kernel included), ``splits=N`` the split count; upper-case keys set
`fp8mla.decode`'s switches instead (SPARSE_SM90_MMA8=1).
"""

import sys
from dataclasses import replace

import torch
from profile_decode import parse_overrides

import fp8mla.decode as decode_mod
from fp8mla.bench.harness import script_args
from fp8mla.bench.sparse import POOL_TOKENS
from fp8mla.formats import KV_DIM, kv_format
from fp8mla.runtime import decode_config
from fp8mla.sparse import SparsePlan

script_args(__doc__, 2)
batch, heads = map(int, sys.argv[1:3])
opts = {"splits": None, "pool": POOL_TOKENS, "topk": 2048}
for k, v in (kv.split("=") for kv in sys.argv[3:] if kv[0].isupper()):
    setattr(decode_mod, k, type(getattr(decode_mod, k))(int(v)))
over = parse_overrides([kv for kv in sys.argv[3:] if not kv[0].isupper()], opts)
fmt = kv_format("fp8_ds_mla")
rows = torch.randint(0, 120, (opts["pool"], fmt.row_bytes), dtype=torch.uint8, device="cuda")
idx = torch.randint(0, opts["pool"], (batch, opts["topk"]), dtype=torch.int32, device="cuda")
q = torch.randn(batch, heads, KV_DIM, device="cuda").bfloat16()
cfg = replace(decode_config(90, "fp8_ds_mla", heads, 1, sparse=True), **over)
plan = SparsePlan(num_queries=batch, num_heads=heads, topk=opts["topk"], kv_format=fmt,
                  device="cuda", config=cfg if over else None, num_splits=opts["splits"])
for _ in range(3):
    plan.run(q, rows, idx, check=False)
torch.cuda.synchronize()
print("profiled sparse", batch, heads, opts, cfg, "splits", plan.num_splits, "sm90", plan.sm90, "mma8", plan.mma8)
