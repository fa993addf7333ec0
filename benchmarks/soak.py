"""CUDA-graph soak (issue #8): one decode step captured once and replayed N times while
requests grow, finish and are replaced, and their pages are freed and reused.

    python benchmarks/soak.py OUT.json [--steps 10000] [--format fp8_ds_mla]

The captured step writes each request's new token into the paged cache (quantize-on-write)
and attends over the cache (`DecodePlan.run`, check=False). Between replays the host only
edits the static inputs in place: block table, lengths, slot mapping, q and the new tokens.
Every 100th step the output is compared with the float32 reference on the dequantized cache.
Device memory allocated by PyTorch is recorded after the first check (one-time allocations such
as cuBLAS's workspace are made by then) and after the last replay, and must not grow. Results
(steps, checks, worst errors, memory, pages reused) go to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from fp8mla import reference
from fp8mla.bench.harness import graphed
from fp8mla.cache import PageAllocator, PagedKVCache
from fp8mla.decode import DecodePlan
from fp8mla.formats import KV_DIM
from fp8mla.testing import assert_close


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--format", default="fp8_ds_mla")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--max-len", type=int, default=3000)
    args = p.parse_args()
    # without a GPU (TRITON_INTERPRET=1) the same loop runs eagerly: a smoke test of the script
    gpu = torch.cuda.is_available()
    dev, B, H, ps = ("cuda" if gpu else "cpu"), args.batch, args.heads, args.page_size
    rng = random.Random(0)
    max_pages = -(-args.max_len // ps)
    num_pages = B * max_pages + 8
    cache = PagedKVCache(num_pages, ps, args.format, device=dev)
    cache.layer(0).fill_(0x7F)  # NaN bytes in every format until written
    alloc = PageAllocator(num_pages)
    pages: list[list[int]] = [[] for _ in range(B)]
    lens = [0] * B
    target = [rng.randint(1, args.max_len) for _ in range(B)]
    allocations = [0]  # pages handed out over the run (> pool_pages: pages were reused)

    table = torch.zeros(B, max_pages, dtype=torch.int32, device=dev)
    seqlens = torch.zeros(B, dtype=torch.int32, device=dev)
    slots = torch.zeros(B, dtype=torch.int64, device=dev)
    q = torch.zeros(B, 1, H, KV_DIM, dtype=torch.bfloat16, device=dev)
    latent = torch.zeros(B, 512, dtype=torch.bfloat16, device=dev)
    rope = torch.zeros(B, 64, dtype=torch.bfloat16, device=dev)
    plan = DecodePlan(batch=B, num_heads=H, kv_format=args.format, page_size=ps,
                      max_seqlen=args.max_len, device=dev)

    def step():
        cache.store(0, latent, rope, slots, check=False)
        plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0), check=False)

    def advance():
        """Host bookkeeping for the next step: finish/replace requests, grow the others."""
        finished = 0
        for b in range(B):
            if lens[b] >= target[b]:
                alloc.free(pages[b])
                pages[b], lens[b], target[b] = [], 0, rng.randint(1, args.max_len)
                finished += 1
            if lens[b] % ps == 0:
                pages[b] += alloc.allocate(1)
                allocations[0] += 1
            lens[b] += 1
        tab = torch.zeros(B, max_pages, dtype=torch.int32)
        for b in range(B):
            tab[b, :len(pages[b])] = torch.tensor(pages[b], dtype=torch.int32)
        table.copy_(tab)
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        pos = [n - 1 for n in lens]
        slots.copy_(torch.tensor([pages[b][pos[b] // ps] * ps + pos[b] % ps for b in range(B)]))
        q.normal_()
        latent.normal_()
        rope.normal_()
        return finished

    advance()
    replay = graphed(step) if gpu else step  # the warm-ups store the same token again
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    mem0 = torch.cuda.memory_allocated() if gpu else 0
    checks, worst_out, worst_lse, finished, t0 = 0, 0.0, 0.0, 0, time.time()
    for i in range(args.steps):
        if i:
            finished += advance()
        replay()
        if i % 100 == 0 or i == args.steps - 1:
            sync()
            ro, rl = reference.dense_mla_decode(q, cache.dequantize(0), table, seqlens,
                                                KV_DIM ** -0.5)
            out, lse = plan.out, plan.lse
            assert_close(out, ro, name=f"step {i} out")
            assert_close(lse, rl, atol=1e-3, rtol=1e-3, name=f"step {i} lse")
            worst_out = max(worst_out, float((out.float() - ro).abs().max()))
            worst_lse = max(worst_lse, float((lse - rl).abs().max()))
            checks += 1
            del ro, rl
            if checks == 1:  # after the first check: one-time allocations (cuBLAS workspace) done
                mem_first = torch.cuda.memory_allocated() if gpu else 0
    sync()
    mem1 = torch.cuda.memory_allocated() if gpu else 0
    result = {
        "what": "CUDA-graph soak: store + dense decode, one capture, replays with changing "
                "lengths, finished requests and reused pages",
        "format": args.format, "batch": B, "heads": H, "page_size": ps, "pool_pages": num_pages,
        "steps": args.steps, "reference_checks": checks, "requests_finished": finished,
        "page_allocations": allocations[0],
        "max_abs_err_out": worst_out, "max_abs_err_lse": worst_lse,
        "memory_allocated_after_capture": mem0, "memory_allocated_first_check": mem_first,
        "memory_allocated_end": mem1, "memory_growth_bytes": mem1 - mem_first,
        "seconds": round(time.time() - t0, 1),
        "gpu": torch.cuda.get_device_name() if gpu else "cpu (interpreter)",
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0 if mem1 == mem_first else 1


if __name__ == "__main__":
    raise SystemExit(main())
