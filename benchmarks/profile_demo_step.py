"""Where the GPU time of the demo's decode step goes, kernel by kernel (graph replays profiled).

    python benchmarks/profile_demo_step.py OUT.json [--layers 4] [--mode native]
"""

import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from fp8mla.bench.harness import graphed
from fp8mla.demo import DemoConfig, build, decode_step

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--layers", type=int, default=4)
p.add_argument("--mode", default="native")
args = p.parse_args()
dc = DemoConfig(layers=args.layers, batch=1, context=4096, pool_tokens=495_000)
cfg, layers, kv, ic, table, hidden = build(dc, torch.device("cuda"))
for layer in layers:
    layer.attn_mode = args.mode
step = lambda: decode_step(layers, kv, ic, table, hidden, dc.context)
replay = graphed(step)
for _ in range(3):
    replay()
torch.cuda.synchronize()
reps = 5
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(reps):
        replay()
    torch.cuda.synchronize()
per = defaultdict(lambda: [0.0, 0])
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        k = per[e.name[:90]]
        k[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        k[1] += 1
rows = sorted(({"kernel": n, "us_per_layer": t / reps / args.layers,
                "launches_per_layer": c / reps / args.layers} for n, (t, c) in per.items()),
              key=lambda r: -r["us_per_layer"])
total = sum(r["us_per_layer"] for r in rows)
print(f"{args.mode}: {total:.1f} us of kernels per layer, "
      f"{sum(r['launches_per_layer'] for r in rows):.0f} launches per layer")
for r in rows[:25]:
    print(f"{r['us_per_layer']:9.1f} us  x{r['launches_per_layer']:5.1f}  {r['kernel']}")
with open(args.out, "w") as f:
    json.dump({"mode": args.mode, "us_per_layer": total, "kernels": rows}, f, indent=1)
