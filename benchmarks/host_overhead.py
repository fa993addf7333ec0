"""Where an eager call's host time goes, on a GPU.

    python benchmarks/host_overhead.py OUT.json

Eager rows of `fp8mla bench decode` sit far above their CUDA-graph replays where a Gluon kernel
serves (session 35, H200: fp8 B=1 × 128K × 8 214.6 µs eager against 36.0 replayed; the Triton
kernel's bf16 case 98.1 against 55.3): the launch's host work, not the GPU, sets the pace. For
each of `compat_overhead.py`'s cases and the native and FlashMLA-compatible calls this takes
the host time per call (200 calls enqueued back to back: fewer launches than the stream's queue
holds, so the host never waits on the GPU) and cProfile's heaviest functions over those calls.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time

import torch
from compat_overhead import dense, sparse

from fp8mla.bench.decode import DecodeCase
from fp8mla.bench.harness import env_info

CALLS = 200


def host_us(fn) -> float:
    """Median over 5 rounds of the host time per call, ``CALLS`` calls enqueued a round."""
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]


def profile(fn, top: int = 18) -> str:
    """cProfile's ``top`` functions by own time over ``CALLS`` calls."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> int:
    cases = [dense(DecodeCase(1, 131072, 8), "fp8"), dense(DecodeCase(64, 8192, 16), "fp8"),
             dense(DecodeCase(1, 131072, 8), "bf16"), dense(DecodeCase(64, 8192, 128), "fp8"),
             dense(DecodeCase(1, 131072, 8), "fp8_ds_mla"), sparse(64, 8, 2048),
             sparse(128, 128, 2048)]
    env, rows = env_info(), []
    for name, native, compat in cases:
        for api, fn in (("native", native), ("compat", compat)):
            fn()  # compiled, warm
            rows.append({"case": name, "api": api, "host_us": round(host_us(fn), 1), **env})
            print(json.dumps(rows[-1]), flush=True)
    for name, native, compat in (cases[0], cases[4], cases[5]):  # mma8: fp8, fp8_ds_mla, sparse
        for api, fn in (("native", native), ("compat", compat)):
            print(f"== {name} {api}", flush=True)
            print(profile(fn), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
