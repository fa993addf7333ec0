"""Where an eager call's host time goes, phase by phase, on a GPU.

    python benchmarks/host_phases.py OUT.json

`host_overhead.py` gives the host time of a call and cProfile's view of it (which inflates
every Python call). This times the phases themselves with a nanosecond clock, for 200 calls
enqueued back to back (the host never waits on the GPU), the median of 5 rounds, µs a call:

- fp8mla's launch path (`FastLauncher.launch`, a copy of its fast path with a clock read
  between steps): the parameter list, the current device, the argument key, the cache
  lookup, the stream, Triton's launch metadata, Triton's launcher (`CompiledKernel.run`:
  argument marshalling, tensor descriptors encoded for the driver, the driver's launch) —
  summed over the call's launches, and the launcher per kernel;
- the plan's own steps, each wrapped: input checks (`check_tensor`, `as_cache_rows`,
  `check_paged_inputs`, the sparse pool view), `numerics.enabled`, the outputs' checks
  (`_outputs`), and the argument lists (`_launch_sm90` and `_combine` less their launches);
- the whole call (`DecodePlan.run` / `SparsePlan.run`) and the rest of it.

The clock reads (~30 a call) cost a few µs of the totals.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from compat_overhead import dense, sparse
from launch_costs import host_us
from triton import knobs

import fp8mla.decode as decode_mod
import fp8mla.sparse as sparse_mod
from fp8mla import numerics
from fp8mla.bench.decode import DecodeCase
from fp8mla.bench.harness import env_info, script_args
from fp8mla.kernels import launch

_NS: dict[str, int] = {}
_clock = time.perf_counter_ns


def _add(name: str, ns: int) -> None:
    _NS[name] = _NS.get(name, 0) + ns


_DEPTH: dict[str, int] = {}


def _timed(name: str, fn):
    """``fn`` timed under ``name`` (calls nested under the same name count once)."""
    def wrapper(*args, **kwargs):
        depth = _DEPTH.get(name, 0)
        _DEPTH[name] = depth + 1
        t0 = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[name] = depth
            if depth == 0:
                _add(name, _clock() - t0)
    return wrapper


def _launch(self, grid, args, kwargs):
    """`FastLauncher.launch` with a clock read between its steps (its fast path as written;
    the first call of a key goes through the real one)."""
    t0 = _clock()
    if not (launch.FAST_LAUNCH and self.jitted):
        return self.fn[grid](*args, **kwargs)
    values = self._values(args, kwargs)
    t1 = _clock()
    device = torch.cuda.current_device()
    t2 = _clock()
    key = None if values is None else self._key(device, values, kwargs)
    t3 = _clock()
    kernel = self.kernels.get(key) if key is not None else None
    if kernel is None:
        return _REAL_LAUNCH(self, grid, args, kwargs)
    t4 = _clock()
    stream = launch._raw_stream(device)
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    hooks = knobs.runtime
    t5 = _clock()
    meta = kernel.launch_metadata(grid, stream, *values)
    t6 = _clock()
    kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, meta,
               hooks.launch_enter_hook, hooks.launch_exit_hook, *values)
    t7 = _clock()
    self.hits += 1
    for name, ns in (("launch: parameter list", t1 - t0), ("launch: current device", t2 - t1),
                     ("launch: key", t3 - t2), ("launch: lookup", t4 - t3),
                     ("launch: stream", t5 - t4), ("launch: Triton metadata", t6 - t5),
                     ("launch: Triton launcher", t7 - t6), ("launch (all)", t7 - t0),
                     (f"launcher of {self.fn.__name__}", t7 - t6),
                     (f"launch in {_SITE[-1] if _SITE else 'call'}", t7 - t0)):
        _add(name, ns)


_REAL_LAUNCH = launch.FastLauncher.launch
_SITE: list[str] = []


def _site(name: str, fn):
    """Time ``fn`` whole, and mark launches inside it as its own."""
    def wrapper(*args, **kwargs):
        _SITE.append(name)
        t0 = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(name, _clock() - t0)
            _SITE.pop()
    return wrapper


def _instrument() -> None:
    launch.FastLauncher.launch = _launch
    P = decode_mod.DecodePlan
    P.run = _timed("call", P.run)
    sparse_mod.SparsePlan.run = _timed("call", sparse_mod.SparsePlan.run)
    P._outputs = _timed("outputs' checks", P._outputs)
    P._check_timeline = _timed("timeline check", P._check_timeline)
    P._launch_sm90 = _site("_launch_sm90", P._launch_sm90)
    P._combine = _site("_combine", P._combine)
    numerics.enabled = _timed("numerics.enabled", numerics.enabled)
    for mod in (decode_mod, sparse_mod):
        mod.check_tensor = _timed("input checks", mod.check_tensor)
    decode_mod.as_cache_rows = _timed("input checks", decode_mod.as_cache_rows)
    decode_mod.check_paged_inputs = _timed("input checks", decode_mod.check_paged_inputs)
    sparse_mod._as_slot_rows = _timed("input checks", sparse_mod._as_slot_rows)


def phases(fn, calls: int = 200) -> dict[str, float]:
    """Median over 5 rounds of each phase's µs a call (and the round's host µs a call)."""
    rounds = []
    for _ in range(5):
        _NS.clear()
        host, _ = host_us(fn, calls)
        # host_us warms up with 20 calls first: the phases count calls + 20
        row = {k: v / 1e3 / (calls + 20) for k, v in _NS.items()}
        row["host (timed loop)"] = host
        for site in ("_launch_sm90", "_combine"):
            if site in row:
                row[f"{site} arguments"] = row[site] - row.get(f"launch in {site}", 0.0)
        row["rest of the call"] = row["call"] - sum(
            row.get(k, 0.0) for k in ("launch (all)", "outputs' checks", "timeline check",
                                      "numerics.enabled", "input checks",
                                      "_launch_sm90 arguments", "_combine arguments"))
        rounds.append(row)
    return {k: round(sorted(r.get(k, 0.0) for r in rounds)[2], 2) for k in rounds[0]}


def main() -> int:
    script_args(__doc__)
    _instrument()
    cases = [dense(DecodeCase(1, 131072, 8), "fp8"), dense(DecodeCase(64, 8192, 128), "fp8"),
             dense(DecodeCase(1, 131072, 8), "fp8_ds_mla"), sparse(64, 8, 2048)]
    env, rows = env_info(), []
    for name, native, _ in cases:
        native()
        torch.cuda.synchronize()
        row = {"case": name, **phases(native), **env}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
