"""``fp8mla demo``: the motivating decode step — GLM-5 attention over an FP8 pool sized like the
deployment that started this project — with the attention reading the pool natively, through
``gather_cast`` and through ``full_cast``; per-step time, tokens/s, and a profile by category.

N layers of `DSAAttention` (random weights, per-rank shapes: GLM-5 at TP8 has 8 heads) share
one paged FP8 pool per layer; the requests' contexts are pre-filled with random cache rows; one
decode step runs every layer for one new token per request (attention block only: MLP/MoE is out
of scope and not timed). On a GPU the step is timed from a CUDA graph; on a CPU-only machine a
small configuration runs through the Triton interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

__all__ = ["add_parser", "run", "DemoConfig", "demo_config", "build", "decode_step",
           "profile_step"]

CATEGORIES = ("attention", "indexer", "topk", "cast", "projections/other")


@dataclasses.dataclass
class DemoConfig:
    layers: int
    batch: int
    context: int
    pool_tokens: int
    page_size: int = 64
    kv_format: str = "fp8_ds_mla"
    tp: int = 8
    small: bool = False  # shrink hidden/q_lora/indexer widths (CPU runs)

    @property
    def num_pages(self) -> int:
        """Pages of the pool: ``pool_tokens`` in whole pages."""
        return -(-self.pool_tokens // self.page_size)

    @property
    def pages_per_request(self) -> int:
        """Pages a request holds: its context and the token the step decodes."""
        return -(-(self.context + 1) // self.page_size)


def _model_config(dc: DemoConfig):
    import dataclasses as dc_mod

    from fp8mla.config import preset

    cfg = preset("glm5").split_tp(dc.tp)
    if dc.small:
        cfg = dc_mod.replace(cfg, hidden_size=256, q_lora_rank=128, index_n_heads=8,
                             index_topk=min(cfg.index_topk, 32))
    return cfg


def build(dc: DemoConfig, device):
    """Layers, caches, block table and lengths, with each request's context already cached."""
    import torch

    from fp8mla.cache import IndexKeyCache, PagedKVCache, build_block_table
    from fp8mla.layer import DSAAttention

    cfg = _model_config(dc)
    g = torch.Generator(device="cpu").manual_seed(0)
    gd = torch.Generator(device=device).manual_seed(0)  # weights drawn where they live
    layers = []
    for _ in range(dc.layers):
        layer = DSAAttention(cfg, dtype=torch.bfloat16, device=device)
        with torch.no_grad():
            for p in layer.parameters():
                noise = torch.randn(p.shape, generator=gd, device=device)
                p.copy_(noise * 0.02 if p.dim() > 1 else 1.0 + 0.1 * noise)
        layers.append(layer)
    kv = PagedKVCache(dc.num_pages, dc.page_size, dc.kv_format, num_layers=dc.layers,
                      device=device)
    ic = IndexKeyCache(dc.num_pages, dc.page_size, num_layers=dc.layers, device=device)
    perm = torch.randperm(dc.num_pages, generator=g)[: dc.batch * dc.pages_per_request]
    table = build_block_table(perm.view(dc.batch, dc.pages_per_request).tolist(), device=device)
    pos = torch.arange(dc.context, device=device)
    for layer_i in range(dc.layers):
        for b in range(dc.batch):
            slots = table[b, pos // dc.page_size].long() * dc.page_size + pos % dc.page_size
            rand = lambda n: torch.randn(dc.context, n, generator=gd, device=device).bfloat16()
            kv.store(layer_i, rand(512), rand(64), slots, check=False)
            ic.store(layer_i, rand(128), slots, check=False)
    hidden = (torch.randn(dc.batch, 1, cfg.hidden_size, generator=g) * 0.5).to(device)
    return cfg, layers, kv, ic, table, hidden.bfloat16()


def decode_step(layers, kv, ic, table, hidden, context):
    """One decode step of every layer (residual stream, attention block only)."""
    import torch

    positions = torch.full((hidden.shape[0], 1), context, dtype=torch.int64,
                           device=hidden.device)
    with torch.no_grad():
        step = layers[0].step_inputs(positions, table, kv.page_size)  # shared by every layer
        for i, layer in enumerate(layers):
            hidden = hidden + layer(hidden, positions, kv, ic, i, table, check=False, step=step)
    return hidden


@contextlib.contextmanager
def _native_stderr_muted():
    """The process's stderr (file descriptor 2) sent to /dev/null for the block: torch 2.13's
    profiler writes a line from C++ at each start and stop ("USDT: ... profiler_start"), past
    Python's sys.stderr, into the demo's report. Where fd 2 cannot be duplicated (closed, or
    no such descriptor) the block runs unmuted."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_step(fn) -> dict[str, float]:
    """Per-category self time (µs, CPU + device) of one call of ``fn`` from torch.profiler.
    Categories come from fp8mla's record_function ranges; everything else (projections, norms,
    RoPE, residual) is "projections/other"."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities)
    with _native_stderr_muted():
        prof.__enter__()
    try:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    finally:
        with _native_stderr_muted():
            prof.__exit__(None, None, None)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    device_time = torch.cuda.is_available()
    for evt in prof.events():
        cat = evt.name.split("::", 1)[1] if evt.name.startswith("fp8mla::") else None
        if cat in totals:
            totals[cat] += evt.device_time_total if device_time else evt.cpu_time_total
    whole = sum((e.device_time_total if device_time else e.cpu_time_total)
                for e in prof.events() if e.name == "fp8mla::step")
    totals["projections/other"] = max(0.0, whole - sum(v for k, v in totals.items()
                                                        if k != "projections/other"))
    return totals


def _time_step(step, device, repeats):

    if device.type == "cuda":
        from fp8mla.bench.harness import graphed, time_us

        return time_us(graphed(step)), "CUDA graph"
    step()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1e6 * sorted(times)[len(times) // 2], "eager, Triton interpreter"


def _chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install fp8mla[bench]): no chart"
    fig, ax = plt.subplots(figsize=(8, 3.5))
    left = [0.0] * len(rows)
    names = [r["backend"] for r in rows]
    for cat in CATEGORIES:
        vals = [r["profile_us"].get(cat, 0.0) / 1000.0 for r in rows]
        ax.barh(names, vals, left=left, label=cat)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("ms per decode step (profiled, attention block only)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("GLM-5 attention decode step by category")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"chart: {path}"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the motivating decode step: native FP8 vs casts")
    p.add_argument("--layers", type=int, default=None, help="attention layers (GPU 78, CPU 2)")
    p.add_argument("--batch", type=int, default=1, help="requests decoded together (1)")
    p.add_argument("--context", type=int, default=None,
                   help="tokens cached per request (GPU 4096, CPU 48)")
    p.add_argument("--pool-tokens", type=int, default=None,
                   help="tokens the FP8 pool holds, whole pages of 64 (GPU 495000, CPU 2048); "
                        "at least batch × (context + 1)")
    p.add_argument("--kv-format", default="fp8_ds_mla", choices=["fp8", "fp8_ds_mla"],
                   help="the pool's KV format (fp8_ds_mla)")
    p.add_argument("--backends", default="fp8mla,gather_cast,full_cast",
                   help="comma-separated, timed in this order: fp8mla (reads FP8 natively), "
                        "gather_cast (casts the requests' rows), full_cast (casts the whole "
                        "pool every layer)")
    p.add_argument("--out", default="demo-out", help="folder for the chart and JSON")
    p.set_defaults(func=run)


def demo_config(args, gpu: bool) -> DemoConfig:
    """The run's `DemoConfig` from the command line (defaults by device); ValueError naming the
    option where a value is out of range or the pool cannot hold the batch's pages."""
    def given(name: str, default: int) -> int:
        value = getattr(args, name)
        if value is None:
            return default
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected an int >= 1, got {value}")
        return value

    dc = DemoConfig(layers=given("layers", 78 if gpu else 2), batch=given("batch", 1),
                    context=given("context", 4096 if gpu else 48),
                    pool_tokens=given("pool_tokens", 495_000 if gpu else 2048),
                    kv_format=args.kv_format, small=not gpu)
    needed = dc.batch * dc.pages_per_request
    if needed > dc.num_pages:
        raise ValueError(f"--pool-tokens: {dc.batch} request(s) of {dc.context} + 1 tokens need "
                         f"{needed} pages of {dc.page_size}; a pool of {dc.pool_tokens} tokens "
                         f"has {dc.num_pages}")
    return dc


def _write_records(dc, rows, path) -> None:
    from fp8mla.bench.harness import Record, env_info, read_ceiling_tbps, write_records

    env, ceiling = env_info(), read_ceiling_tbps()
    case = f"demo/glm5-{dc.layers}layers/B{dc.batch}-ctx{dc.context}-pool{dc.pool_tokens}"
    write_records([Record(case=case, backend=r["backend"], us=r["us_per_step"], TBps=None,
                          TFLOPS=None, ceiling_TBps=round(ceiling, 3), **env,
                          note=f"per decode step ({r['timed']}); {r['tokens_per_s']} tokens/s; "
                               f"casts {r['cast_share']:.1%}")
                   for r in rows], path)


def run(args) -> int:
    import json

    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if gpu else "cpu")
    modes = {"fp8mla": "native", "gather_cast": "gather_cast", "full_cast": "full_cast"}
    backends = [b for b in args.backends.split(",") if b]
    bad = [b for b in backends if b not in modes]
    try:
        if bad or not backends:
            raise ValueError(f"--backends: expected some of {', '.join(modes)}, got "
                             f"{args.backends!r}")
        dc = demo_config(args, gpu)
    except ValueError as e:
        print(f"fp8mla demo: error: {e}", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name() if gpu else "CPU through the Triton interpreter (small " \
        "configuration: hidden 256, q_lora 128, 8 index heads; no GPU found)"
    print(f"fp8mla demo on {where}")
    pages = dc.num_pages
    print(f"GLM-5 attention, {dc.layers} layers, {8} heads per GPU (TP{dc.tp}), batch "
          f"{dc.batch}, context {dc.context}, {dc.kv_format} pool of {dc.pool_tokens:,} tokens "
          f"({pages:,} page{'s' if pages > 1 else ''} of {dc.page_size}). "
          "MLP/MoE is out of scope: attention blocks only.", flush=True)
    cfg, layers, kv, ic, table, hidden = build(dc, device)
    rows = []
    for name in backends:
        for layer in layers:
            layer.attn_mode = modes[name]

        def step():
            with torch.profiler.record_function("fp8mla::step"):
                return decode_step(layers, kv, ic, table, hidden, dc.context)

        us, how = _time_step(step, device, repeats=3)
        prof = profile_step(step)
        casts = prof.get("cast", 0.0) / max(1e-9, sum(prof.values()))
        rows.append({"backend": name, "us_per_step": round(us, 1),
                     "tokens_per_s": round(dc.batch / (us * 1e-6), 1), "timed": how,
                     "cast_share": round(casts, 4), "profile_us": prof})
        print(f"  {name:12s} {us / 1000:9.2f} ms/step  {dc.batch / (us * 1e-6):9.1f} tokens/s  "
              f"casts {casts:6.1%} of the step  ({how})", flush=True)
    if not gpu:
        print("  (interpreter timings measure Python, not a GPU: the comparison that matters runs "
              "on one — see BENCHMARKS.md)")
    elif rows and rows[0]["backend"] == "fp8mla":
        for r in rows[1:]:
            print(f"  fp8mla is {r['us_per_step'] / rows[0]['us_per_step']:.1f}x faster than "
                  f"{r['backend']}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump({"config": dataclasses.asdict(dc), "device": where, "rows": rows}, f, indent=1)
    if gpu:  # docs/DESIGN.md §9 records too, beside the read ceiling of this run
        _write_records(dc, rows, os.path.join(args.out, "records.json"))
    print(_chart(rows, os.path.join(args.out, "demo.png")))
    return 0
