"""Where an eager call's host time goes, on a GPU.

    python benchmarks/host_overhead.py OUT.json

Eager rows of `fp8mla bench decode` sit far above their CUDA-graph replays where a Gluon kernel
serves (session 35, H200: fp8 B=1 × 128K × 8 214.6 µs eager against 36.0 replayed; the Triton
kernel's bf16 case 98.1 against 55.3): the launch's host work, not the GPU, sets the pace. For
more cases than `launch_costs.py` times (one kernel of each family), each through the native
and the FlashMLA-compatible call (`compat_overhead.py`'s), this takes the host time per call
with `launch_costs`' timer and profile (200 calls enqueued back to back: fewer launches than
the stream's queue holds, so the host never waits on the GPU), the median of 5 rounds — each
round with Triton's own launch path and with fp8mla's (`fp8mla.kernels.launch.FAST_LAUNCH`,
session 37), alternating; and the wall time per call of the same 200 calls (the GPU's drain
included: what an eager caller waits for).
"""

from __future__ import annotations

import json
import sys

from compat_overhead import dense, sparse
from launch_costs import host_us, top_functions

from fp8mla.bench.decode import DecodeCase
from fp8mla.bench.harness import env_info, script_args
from fp8mla.kernels import launch


def median_host_us(fn) -> dict[bool, tuple[float, float]]:
    """Per `launch.FAST_LAUNCH` setting, the medians over 5 rounds (the settings alternating)
    of `launch_costs.host_us`: (host µs a call, wall µs a call; 200 calls enqueued a round)."""
    times: dict[bool, list] = {False: [], True: []}
    setting = launch.FAST_LAUNCH
    try:
        for _ in range(5):
            for fast in (False, True):
                launch.FAST_LAUNCH = fast
                times[fast].append(host_us(fn))
    finally:
        launch.FAST_LAUNCH = setting
    return {fast: (sorted(t[0] for t in ts)[2], sorted(t[1] for t in ts)[2])
            for fast, ts in times.items()}


def main() -> int:
    script_args(__doc__)
    cases = [dense(DecodeCase(1, 131072, 8), "fp8"), dense(DecodeCase(64, 8192, 16), "fp8"),
             dense(DecodeCase(1, 131072, 8), "bf16"), dense(DecodeCase(64, 8192, 128), "fp8"),
             dense(DecodeCase(1, 131072, 8), "fp8_ds_mla"), sparse(64, 8, 2048),
             sparse(128, 128, 2048)]
    env, rows = env_info(), []
    for name, native, compat in cases:
        for api, fn in (("native", native), ("compat", compat)):
            for fast, (host, wall) in median_host_us(fn).items():
                rows.append({"case": name, "api": api, "fast_launch": fast,
                             "host_us": round(host, 1), "wall_us": round(wall, 1), **env})
                print(json.dumps(rows[-1]), flush=True)
    for name, native, compat in (cases[0], cases[5]):  # mma8 + combine: fp8, sparse
        for api, fn in (("native", native), ("compat", compat)):
            print(f"== {name} {api} (fast launch)", flush=True)
            print(top_functions(fn, n=18), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
