"""Cost model: bytes moved and FLOPs per decode step per layer, per role, and roofline times.

Formulas (docs/DESIGN.md §3, §6), per rank, for ``batch`` requests of ``context`` cached tokens and
``s_q`` query tokens each, H = heads per rank:

- attention, dense: KV rows read once, ``batch·context·row_bytes`` (row bytes: bf16 1152, fp8
  576, fp8_ds_mla 656) + q ``batch·s_q·H·576·2`` + out ``batch·s_q·H·512·2`` (bf16);
  FLOPs ``2·H·tokens·(576+512)`` per query token.
- attention, sparse: the same over ``min(index_topk, context)`` tokens per query token.
- ``full_cast``: adds ``pool_tokens·576·3`` bytes (read FP8, write BF16: 495,000 tokens →
  855,360,000 bytes per layer), then BF16 attention (1152-byte rows); ``gather_cast`` adds
  ``batch·context·576·3`` instead.
- indexer: index keys ``132`` bytes per token × context (+ FP8 q_I, float32 weights, float32
  logits written); FLOPs ``2·index_heads·128·context`` per query token, at the FP8 rate.
- top-k: 4 bytes per logit read (+ int32 indices written); no tensor FLOPs.

Predicted time = max(bytes / bandwidth, FLOPs / rate): a roofline lower bound (docs/DESIGN.md §5:
the whole-pool cast measured 847 µs on an H200, about 4× its roofline). Prefill roles are not
priced here (a decode step runs none).
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8mla.backends.records import Role
from fp8mla.backends.resolver import Plan, Runtime
from fp8mla.config import MLAConfig
from fp8mla.gpus import GPUSpec

__all__ = [
    "KV_ROW_BYTES",
    "INDEX_KEY_BYTES",
    "LOGIT_BYTES",
    "RoleCost",
    "PlanCost",
    "cast_bytes",
    "roofline_time",
    "role_cost",
    "plan_cost",
]

#: Bytes per cached token per layer (docs/DESIGN.md §3).
KV_ROW_BYTES = {"bf16": 1152, "fp8": 576, "fp8_ds_mla": 656}
#: Indexer key bytes per token: 128 e4m3 + one float32 scale.
INDEX_KEY_BYTES = 132
#: Bytes per float32 logit / int32 index.
LOGIT_BYTES = 4
_BF16 = 2
_CAST_BYTES_PER_VALUE = 3  # read one e4m3 byte, write two bf16 bytes


@dataclass(frozen=True)
class RoleCost:
    """One role's work per decode step per layer on one rank. ``breakdown``: (component,
    bytes) pairs summing to ``bytes``. ``time_s``: roofline time (None without GPU figures);
    ``bound``: ``"bandwidth"`` or ``"compute"``."""

    role: Role
    backend: str
    tokens: int
    bytes: int
    flops: int
    breakdown: tuple[tuple[str, int], ...]
    time_s: float | None
    bound: str | None


@dataclass(frozen=True)
class PlanCost:
    """A plan's decode step: per-role costs, the per-layer sum, and × num_layers.
    ``complete`` is False when some decode role is unserved (its cost is missing)."""

    roles: tuple[RoleCost, ...]
    num_layers: int
    per_layer_s: float | None
    per_step_s: float | None
    complete: bool
    warnings: tuple[str, ...]


def cast_bytes(tokens: int, kv_dim: int = 576) -> int:
    """Bytes a FP8 → BF16 cast of ``tokens`` rows moves: ``tokens·kv_dim·3``."""
    return tokens * kv_dim * _CAST_BYTES_PER_VALUE


def roofline_time(nbytes: int, flops: int, gpu: GPUSpec, fp8: bool = False
                  ) -> tuple[float | None, str | None]:
    """``max(bytes / bandwidth, flops / rate)`` in seconds and which bound wins; ``(None,
    None)`` when the GPU has no figures. ``fp8``: use the FP8 rate (falls back to BF16)."""
    if not gpu.has_figures:
        return None, None
    rate = (gpu.fp8_tflops if fp8 and gpu.fp8_tflops else gpu.bf16_tflops) * 1e12
    t_mem = nbytes / (gpu.bandwidth_tbps * 1e12)
    t_math = flops / rate
    return (t_mem, "bandwidth") if t_mem >= t_math else (t_math, "compute")


def _attention(role: Role, backend: str, rank: MLAConfig, rt: Runtime) -> RoleCost:
    sparse = role == Role.SPARSE_DECODE
    tokens = min(rank.index_topk, rt.context) if sparse else rt.context
    rows = rt.batch * rt.s_q * tokens if sparse else rt.batch * tokens
    queries = rt.batch * rt.s_q
    kv_dim, v_dim = rank.kv_dim, rank.kv_lora_rank
    parts: list[tuple[str, int]] = []
    if backend == "full_cast":
        parts.append(("cast_pool", cast_bytes(rt.pool_tokens, kv_dim)))
    elif backend == "gather_cast":
        parts.append(("cast_gathered", cast_bytes(rows, kv_dim)))
    casts = backend in ("full_cast", "gather_cast")
    row_bytes = kv_dim * _BF16 if casts else KV_ROW_BYTES[rt.kv_format]
    parts += [("kv_rows", rows * row_bytes),
              ("q", queries * rank.num_heads * kv_dim * _BF16),
              ("out", queries * rank.num_heads * v_dim * _BF16)]
    flops = 2 * rank.num_heads * tokens * (kv_dim + v_dim) * queries
    nbytes = sum(b for _, b in parts)
    t, bound = roofline_time(nbytes, flops, rt.gpu)
    return RoleCost(role, backend, tokens, nbytes, flops, tuple(parts), t, bound)


def role_cost(role: Role, backend: str, rank: MLAConfig, rt: Runtime) -> RoleCost | None:
    """The decode-step cost of ``role`` run by ``backend`` for the per-rank model ``rank``;
    None for prefill roles."""
    if role in (Role.DENSE_DECODE, Role.SPARSE_DECODE):
        return _attention(role, backend, rank, rt)
    queries = rt.batch * rt.s_q
    if role == Role.INDEXER:
        hi, di = rank.index_n_heads, rank.index_head_dim
        parts = (("index_keys", rt.batch * rt.context * INDEX_KEY_BYTES),
                 ("q", queries * hi * di),  # e4m3, its scale folded into the weights
                 ("weights", queries * hi * LOGIT_BYTES),
                 ("logits_out", queries * rt.context * LOGIT_BYTES))
        flops = 2 * hi * di * rt.context * queries
        nbytes = sum(b for _, b in parts)
        t, bound = roofline_time(nbytes, flops, rt.gpu, fp8=True)
        return RoleCost(role, backend, rt.context, nbytes, flops, parts, t, bound)
    if role == Role.TOPK:
        k = min(rank.index_topk, rt.context)
        parts = (("logits_in", queries * rt.context * LOGIT_BYTES),
                 ("indices_out", queries * rank.index_topk * LOGIT_BYTES))
        nbytes = sum(b for _, b in parts)
        t, bound = roofline_time(nbytes, 0, rt.gpu)
        return RoleCost(role, backend, k, nbytes, 0, parts, t, bound)
    return None


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def plan_cost(plan: Plan) -> PlanCost:
    """Price every decode role of ``plan`` with its chosen backend; warn about full_cast."""
    rt, rank = plan.runtime, plan.rank_model
    costs: list[RoleCost] = []
    complete = True
    warnings: list[str] = []
    for choice in plan.roles:
        if choice.role not in (Role.DENSE_DECODE, Role.SPARSE_DECODE, Role.INDEXER, Role.TOPK):
            continue
        if choice.backend is None:
            complete = False
            continue
        c = role_cost(choice.role, choice.backend, rank, rt)
        costs.append(c)
        if choice.backend == "full_cast":
            cast = dict(c.breakdown)["cast_pool"]
            t, _ = roofline_time(cast, 0, rt.gpu)
            when = f", >= {_fmt_ms(t * plan.model.num_layers)} per decode step over " \
                   f"{plan.model.num_layers} layers on {rt.gpu.name} (roofline lower bound)" \
                   if t is not None else ""
            warnings.append(
                f"full_cast casts the whole {rt.pool_tokens:,}-token pool to BF16 on every layer "
                f"of every step: {cast / 1e6:,.1f} MB per layer{when}")
    on_ref = [c.role.value for c in costs if c.backend == "reference"]
    if on_ref:
        warnings.append(f"times for {', '.join(on_ref)} are kernel rooflines; the float32 "
                        "reference that serves them is far slower")
    times = [c.time_s for c in costs]
    per_layer = sum(times) if costs and all(t is not None for t in times) else None
    per_step = per_layer * plan.model.num_layers if per_layer is not None else None
    if per_layer is None and costs:
        warnings.append(f"no bandwidth/TFLOPS figures for {rt.gpu.name}: bytes and FLOPs only")
    return PlanCost(tuple(costs), plan.model.num_layers, per_layer, per_step,
                    complete, tuple(warnings))
