"""``fp8mla doctor``: before anything loads, say which kernel will run each attention role, why,
what every other candidate lacks, and what a decode step will cost.

Exit status: 0 when every needed role is served, 1 when some role cannot be (including an
explicit ``--<role>-backend`` that cannot serve), 2 for bad arguments.

JSON schema (``--json``; ``schema_version`` 1; times in microseconds / milliseconds)::

    {
      "schema_version": 1,
      "ok": bool,                          # every needed role served
      "model": {"name", "source", "is_sparse", "num_heads", "num_heads_per_rank",
                "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "num_layers",
                "index_n_heads", "index_head_dim", "index_topk"},
      "gpu": {"name", "compute_capability" ("sm120"), "bandwidth_TBps", "bf16_TFLOPS",
              "fp8_TFLOPS" (numbers or null), "origin" ("named"|"detected"|"default"),
              "why", "source"},
      "runtime": {"kv_format", "page_size", "tp_size", "s_q", "pool_tokens", "batch",
                  "context"},
      "plan": [{"role", "backend" (str|null), "automatic": bool, "cuda_graph_safe" (bool|null),
                "reason", "candidates": [{"backend", "status" ("taken"|"serves"|"rejected"),
                                          "violations": [str], "reason"}]}],
      "unservable": [role],
      "cost": {"roles": [{"role", "backend", "tokens", "bytes", "flops", "time_us" (num|null),
                          "bound" ("bandwidth"|"compute"|null), "breakdown": {name: bytes}}],
               "num_layers", "per_layer_us" (num|null), "per_step_ms" (num|null),
               "complete": bool, "note"},
      "warnings": [str]
    }

Bad arguments print ``fp8mla doctor: error: ...`` on stderr (exit 2), with or without --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata

from fp8mla._versions import NEED_TRITON, triton_accepted, triton_minor
from fp8mla.backends.records import KV_FORMATS, ROLES
from fp8mla.backends.resolver import Plan, Runtime, resolve
from fp8mla.config import PRESETS, resolve_model
from fp8mla.cost import PlanCost, plan_cost
from fp8mla.gpus import DEFAULT_GPU, GPUSpec, detect_gpu, resolve_gpu, valid_gpu_names

__all__ = ["SCHEMA_VERSION", "add_parser", "run", "build_report", "format_report"]

SCHEMA_VERSION = 1


class _ArgError(ValueError):
    """A bad command-line argument (exit status 2)."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``doctor`` on a subparsers object (``fp8mla.cli``); sets ``func=run``."""
    p = subparsers.add_parser(
        "doctor", help="explain which attention backend runs each role, and the cost",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", default="glm5",
                   help=f"preset ({', '.join(sorted(PRESETS))}) or a config.json path "
                   "(default: glm5)")
    p.add_argument("--gpu", default=None,
                   help=f"{', '.join(valid_gpu_names())}, or a compute capability such as "
                   f"sm120 (default: the local GPU, else {DEFAULT_GPU})")
    p.add_argument("--kv-format", default="fp8_ds_mla",
                   help=f"{', '.join(KV_FORMATS)} (default: fp8_ds_mla)")
    p.add_argument("--page-size", type=int, default=64, help="tokens per page (default: 64)")
    p.add_argument("--tp", type=int, default=8, help="tensor-parallel size (default: 8)")
    p.add_argument("--pool-tokens", type=int, default=495_000,
                   help="tokens in the KV pool (default: 495000)")
    p.add_argument("--batch", type=int, default=1, help="decode batch size (default: 1)")
    p.add_argument("--context", type=int, default=4096,
                   help="cached tokens per request (default: 4096)")
    p.add_argument("--s-q", type=int, default=1,
                   help="query tokens per request per step, >1 for MTP (default: 1)")
    for role in ROLES:
        p.add_argument(f"--{role.value.replace('_', '-')}-backend", default=None, metavar="NAME",
                       help=f"explicit backend for {role.value}")
    p.add_argument("--exclude", default="", metavar="NAME[,NAME]",
                   help="backends never chosen automatically, e.g. reference,full_cast")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
    return p


def _pick_gpu(name: str | None) -> tuple[GPUSpec, str, str]:
    if name is not None:
        return resolve_gpu(name), "named", f"--gpu {name}"
    spec, why = detect_gpu()
    if spec is not None:
        return spec, "detected", why
    return resolve_gpu(DEFAULT_GPU), "default", (
        f"{why}; assuming {DEFAULT_GPU}, the motivating deployment's GPU (pass --gpu)")


def _plan_from_args(args: argparse.Namespace) -> tuple[Plan, str, str]:
    try:
        model = resolve_model(args.model)
        gpu, origin, why = _pick_gpu(args.gpu)
        runtime = Runtime(gpu=gpu, kv_format=args.kv_format, page_size=args.page_size,
                          tp_size=args.tp, s_q=args.s_q, pool_tokens=args.pool_tokens,
                          batch=args.batch, context=args.context)
        choices = {r: getattr(args, f"{r.value}_backend") for r in ROLES}
        exclude = [x.strip() for x in args.exclude.split(",") if x.strip()]
        plan = resolve(model, runtime, choices, strict=False, exclude=exclude)
    except ValueError as e:
        raise _ArgError(str(e)) from None
    return plan, origin, why


def build_report(plan: Plan, cost: PlanCost, gpu_origin: str, gpu_why: str,
                 model_source: str) -> dict:
    """The doctor report as JSON-ready data (schema in this module's docstring)."""
    m, rank, rt, gpu = plan.model, plan.rank_model, plan.runtime, plan.runtime.gpu
    return {
        "schema_version": SCHEMA_VERSION,
        "ok": plan.ok,
        "model": {
            "name": m.name, "source": model_source, "is_sparse": m.is_sparse,
            "num_heads": m.num_heads, "num_heads_per_rank": rank.num_heads,
            "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim,
            "qk_nope_head_dim": m.qk_nope_head_dim, "num_layers": m.num_layers,
            "index_n_heads": m.index_n_heads, "index_head_dim": m.index_head_dim,
            "index_topk": m.index_topk,
        },
        "gpu": {
            "name": gpu.name, "compute_capability": gpu.sm,
            "bandwidth_TBps": gpu.bandwidth_tbps, "bf16_TFLOPS": gpu.bf16_tflops,
            "fp8_TFLOPS": gpu.fp8_tflops, "origin": gpu_origin, "why": gpu_why,
            "source": gpu.source,
        },
        "runtime": {
            "kv_format": rt.kv_format, "page_size": rt.page_size, "tp_size": rt.tp_size,
            "s_q": rt.s_q, "pool_tokens": rt.pool_tokens, "batch": rt.batch,
            "context": rt.context,
        },
        "plan": [
            {
                "role": c.role.value, "backend": c.backend, "automatic": c.automatic,
                "cuda_graph_safe": c.record.cuda_graph_safe if c.record else None,
                "reason": c.reason,
                "candidates": [
                    {"backend": k.backend, "status": k.status,
                     "violations": list(k.violations), "reason": k.reason}
                    for k in c.candidates
                ],
            }
            for c in plan.roles
        ],
        "unservable": [r.value for r in plan.unservable],
        "cost": {
            "roles": [
                {"role": c.role.value, "backend": c.backend, "tokens": c.tokens,
                 "bytes": c.bytes, "flops": c.flops,
                 "time_us": None if c.time_s is None else c.time_s * 1e6,
                 "bound": c.bound, "breakdown": dict(c.breakdown)}
                for c in cost.roles
            ],
            "num_layers": cost.num_layers,
            "per_layer_us": None if cost.per_layer_s is None else cost.per_layer_s * 1e6,
            "per_step_ms": None if cost.per_step_s is None else cost.per_step_s * 1e3,
            "complete": cost.complete,
            "note": "roofline lower bound: max(bytes/bandwidth, FLOPs/rate) per role, per rank",
        },
        "warnings": (list(plan.warnings) + list(cost.warnings)
                     + triton_warnings(_triton_version())),
    }


def _triton_version() -> str | None:
    """The installed Triton's version, read without importing it (the doctor loads nothing)."""
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def triton_warnings(version: str | None) -> list[str]:
    """What the Triton ``version`` changes about the kernels fp8mla runs: nothing, except 3.8
    (RELIABILITY.md, "Across Triton versions"), and Tritons fp8mla refuses
    (`fp8mla.kernels.require_triton`)."""
    if version is None:
        return [f"triton is not installed: fp8mla's kernels need {NEED_TRITON}"]
    if not triton_accepted(version):
        return [f"triton {version} is older than fp8mla needs ({NEED_TRITON}): importing the "
                f"kernels will fail"]
    if triton_minor(version) != (3, 8):
        return []
    return [f"triton {version} keeps the dense decode kernel's fp8 tiles, converted by the "
            "hardware (sm_89+), in shared memory: up to ~1.9x what 3.6, 3.7 and 3.9 use. Plans "
            "step such a config down to fit (fp8 plans of <= 16 rows on sm_120: 32-token tiles; "
            "32-row fp8 plans on sm_90: 64-token tiles) and elsewhere hold fewer programs an SM, "
            "untimed. On sm_90, fp8 plans of 9-32 rows (whose Triton kernel ran up to 1.7x 3.6's "
            "time) take the Gluon wide form instead, in head blocks above 16 rows, at any "
            "length, where it serves (pages of >= 64 tokens). triton 3.9 (torch 2.15) or 3.6 / 3.7 run the "
            "measured configs"]


def _us(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.1f} us"


def format_report(report: dict) -> str:
    """The human-readable form of `build_report`'s data."""
    m, g, rt = report["model"], report["gpu"], report["runtime"]
    kind = "DSA (sparse)" if m["is_sparse"] else "dense MLA"
    lines = [
        f"model   {m['name']} ({kind}): {m['num_heads']} heads, {m['num_heads_per_rank']} per "
        f"rank at tp {rt['tp_size']}; qk_nope {m['qk_nope_head_dim']}, {m['num_layers']} layers",
        f"gpu     {g['name']} ({g['compute_capability']}), {g['origin']}: {g['why']}",
        f"runtime kv_format {rt['kv_format']}, page_size {rt['page_size']}, s_q {rt['s_q']}, "
        f"batch {rt['batch']} x context {rt['context']}, pool {rt['pool_tokens']:,} tokens",
        "",
        "PLAN",
    ]
    width = max(len(p["role"]) for p in report["plan"])
    for p in report["plan"]:
        backend = p["backend"] or "UNSERVABLE"
        how = "automatic" if p["automatic"] else "explicit"
        graph = {True: "graph-safe", False: "not graph-safe", None: ""}[p["cuda_graph_safe"]]
        lines.append(f"  {p['role']:<{width}}  {backend:<12} {how:<9}  {graph}")
        if p["backend"] is None:
            lines.append(f"  {'':<{width}}  -> {p['reason']}")
    lines += ["", "CANDIDATES (preference order)"]
    for p in report["plan"]:
        lines.append(f"  {p['role']}:")
        for k in p["candidates"]:
            lines.append(f"    [{k['status']:<8}] {k['reason']}")
    c = report["cost"]
    lines += ["", f"DECODE STEP COST (per rank; {c['note']})"]
    for r in c["roles"]:
        lines.append(f"  {r['role']:<{width}}  {r['backend']:<12} {r['bytes'] / 1e6:>10,.2f} MB "
                     f"{r['flops'] / 1e9:>9,.2f} GFLOP  {_us(r['time_us']):>12}  "
                     f"{r['bound'] or ''}")
    if c["per_layer_us"] is not None:
        partial = "" if c["complete"] else " (incomplete: some role unserved)"
        lines.append(f"  per layer {_us(c['per_layer_us'])}; x {c['num_layers']} layers = "
                     f"{c['per_step_ms']:,.3f} ms per decode step{partial}")
    if report["warnings"]:
        lines += ["", "WARNINGS"] + [f"  - {w}" for w in report["warnings"]]
    verdict = "OK: every role is served" if report["ok"] else \
        f"NOT SERVABLE: {', '.join(report['unservable'])}"
    lines += ["", verdict]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the doctor for parsed ``args``; prints the report, returns the exit status."""
    try:
        plan, origin, why = _plan_from_args(args)
    except _ArgError as e:
        print(f"fp8mla doctor: error: {e}", file=sys.stderr)
        return 2
    source = "preset" if args.model in PRESETS else args.model
    report = build_report(plan, plan_cost(plan), origin, why, source)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if plan.ok else 1

