"""Explainable backend resolution: one backend per attention role, with every candidate's why.

`resolve(model, runtime, choices)` decides which roles the model needs (dense MLA: dense
prefill + dense decode; DSA: sparse prefill, indexer, top-k, sparse decode), checks every
registered candidate against the per-rank problem, and picks by preference (fp8mla's kernels,
then importable external kernels, then baselines, the reference last) unless the user chose.
Nothing is replaced silently: an explicit choice that cannot serve raises `BackendChoiceError`
(or, with ``strict=False``, leaves the role unserved with the reasons), automatic choices are
marked automatic, and a DSA model's decode on a dense backend carries a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fp8mla.backends.records import (
    KV_FORMATS,
    ROLES,
    BackendRecord,
    Problem,
    Role,
    Tier,
    probe_available,
)
from fp8mla.backends.registry import backend_names, candidates_for, record_for, records_for
from fp8mla.config import MLAConfig, resolve_model
from fp8mla.gpus import GPUSpec

__all__ = [
    "Runtime",
    "Candidate",
    "RoleChoice",
    "Plan",
    "BackendChoiceError",
    "needed_roles",
    "parse_role",
    "resolve",
]

Probe = Callable[[BackendRecord], "str | None"]


def _check_int(name: str, value: object, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {value!r}")


@dataclass(frozen=True)
class Runtime:
    """Where and how the model runs: the GPU, KV format, page size, TP, and the decode shape
    the cost model prices (``batch`` requests of ``context`` tokens, ``s_q`` query tokens each,
    in a pool of ``pool_tokens`` cached tokens)."""

    gpu: GPUSpec
    kv_format: str = "fp8_ds_mla"
    page_size: int = 64
    tp_size: int = 1
    s_q: int = 1
    pool_tokens: int = 0
    batch: int = 1
    context: int = 4096

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GPUSpec):
            raise ValueError(f"gpu: expected a GPUSpec (see fp8mla.gpus.resolve_gpu), "
                             f"got {self.gpu!r}")
        if self.kv_format not in KV_FORMATS:
            raise ValueError(f"kv_format: expected one of {', '.join(KV_FORMATS)}, "
                             f"got {self.kv_format!r}")
        for name, lo in (("page_size", 1), ("tp_size", 1), ("s_q", 1), ("pool_tokens", 0),
                         ("batch", 1), ("context", 1)):
            _check_int(name, getattr(self, name), lo)


@dataclass(frozen=True)
class Candidate:
    """One backend considered for one role. ``status``: ``"taken"``, ``"serves"`` (could serve,
    another was preferred or chosen) or ``"rejected"`` (``violations`` says why)."""

    backend: str
    status: str
    violations: tuple[str, ...]
    reason: str
    cuda_graph_safe: bool


@dataclass(frozen=True)
class RoleChoice:
    """The backend for one role (None: unservable), whether chosen automatically, and every
    candidate considered, in preference order."""

    role: Role
    backend: str | None
    automatic: bool
    reason: str
    candidates: tuple[Candidate, ...]
    record: BackendRecord | None = None

    @property
    def served(self) -> bool:
        return self.backend is not None

    def serving(self) -> list[str]:
        """Backends that could serve this role."""
        return [c.backend for c in self.candidates if c.status != "rejected"]


@dataclass(frozen=True)
class Plan:
    """One backend per needed role, with reasons and warnings. ``rank_model``: the per-rank
    shape (heads split by TP)."""

    model: MLAConfig
    rank_model: MLAConfig
    runtime: Runtime
    roles: tuple[RoleChoice, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every needed role is served."""
        return all(c.served for c in self.roles)

    @property
    def unservable(self) -> list[Role]:
        return [c.role for c in self.roles if not c.served]

    def choice(self, role: Role | str) -> RoleChoice:
        """The `RoleChoice` for ``role``; KeyError if the plan does not need it."""
        role = parse_role(role)
        for c in self.roles:
            if c.role == role:
                return c
        raise KeyError(f"role {role.value} is not part of this plan "
                       f"(roles: {', '.join(c.role.value for c in self.roles)})")


class BackendChoiceError(ValueError):
    """An explicit backend choice that cannot serve its role. Attributes: ``role``,
    ``backend``, ``violations`` (constraint messages) and ``alternatives`` (backends that
    would serve)."""

    def __init__(self, role: Role, backend: str, violations: list[str],
                 alternatives: list[str]):
        self.role, self.backend = role, backend
        self.violations, self.alternatives = list(violations), list(alternatives)
        alt = ", ".join(alternatives) if alternatives else "none"
        super().__init__(
            f"{role.value}_backend: {backend} cannot serve {role.value}: "
            f"{'; '.join(violations)}. Backends that would serve: {alt}"
        )


def parse_role(role: Role | str) -> Role:
    """A `Role` from itself or its name (``"sparse_decode"``); ValueError listing valid ones."""
    if isinstance(role, Role):
        return role
    try:
        return Role(role)
    except ValueError:
        raise ValueError(f"role: unknown role {role!r}; valid: "
                         f"{', '.join(r.value for r in ROLES)}") from None


def needed_roles(model: MLAConfig, explicit: Iterable[Role] = ()) -> list[Role]:
    """Roles a model needs. Dense MLA: dense_prefill, dense_decode. DSA: sparse_prefill,
    indexer, topk, sparse_decode — with dense_decode replacing sparse_decode (and dense_prefill
    added) only when explicitly requested."""
    explicit = set(explicit)
    if not model.is_sparse:
        return [Role.DENSE_PREFILL, Role.DENSE_DECODE]
    roles = [Role.SPARSE_PREFILL, Role.INDEXER, Role.TOPK]
    if Role.DENSE_PREFILL in explicit:
        roles.insert(0, Role.DENSE_PREFILL)
    roles.append(Role.DENSE_DECODE if Role.DENSE_DECODE in explicit else Role.SPARSE_DECODE)
    return roles


def _problem(role: Role, rank: MLAConfig, rt: Runtime) -> Problem:
    return Problem(
        role=role, kv_format=rt.kv_format, num_heads=rank.num_heads, page_size=rt.page_size,
        kv_lora_rank=rank.kv_lora_rank, qk_rope_head_dim=rank.qk_rope_head_dim,
        qk_nope_head_dim=rank.qk_nope_head_dim, s_q=rt.s_q,
        compute_capability=rt.gpu.compute_capability, device=rt.gpu.name, tp_size=rt.tp_size,
        index_n_heads=rank.index_n_heads, index_head_dim=rank.index_head_dim,
    )


def _check(record: BackendRecord, problem: Problem, probe: Probe,
           excluded: frozenset[str]) -> list[str]:
    out = record.violations(problem)
    if record.name in excluded:
        out.insert(0, "excluded by the user")
    missing = probe(record)
    if missing:
        out.insert(0, missing)
    return out


def _taken_reason(record: BackendRecord, automatic: bool, fmt: str) -> str:
    if not automatic:
        return f"{record.name}: explicitly requested"
    why = {
        Tier.NATIVE: f"fp8mla's own kernel, reads {fmt} directly (preferred first)",
        Tier.EXTERNAL: "external kernel that serves this problem (no fp8mla kernel serves)",
        Tier.BASELINE: "baseline: no fp8mla or external kernel serves",
        Tier.REFERENCE: "float32 reference: nothing else serves (slow, not graph-safe)",
    }[record.tier]
    return f"{record.name}: chosen automatically: {why}"


def _resolve_role(role: Role, rank: MLAConfig, rt: Runtime, explicit: str | None,
                  probe: Probe, excluded: frozenset[str], strict: bool) -> RoleChoice:
    problem = _problem(role, rank, rt)
    records = candidates_for(role)
    checked = [(r, _check(r, problem, probe, excluded)) for r in records]
    chosen: BackendRecord | None = None
    if explicit is not None:
        rec = record_for(explicit, role)
        if rec is None:
            roles = sorted({x.value for r in records_for(explicit) for x in r.roles})
            violations = [f"does not implement {role.value} (implements: {', '.join(roles)})"]
        else:
            violations = next(v for r, v in checked if r is rec)
        if violations:
            alternatives = [r.name for r, v in checked if not v]
            if strict:
                raise BackendChoiceError(role, explicit, violations, alternatives)
            bad = Candidate(explicit, "rejected", tuple(violations),
                            f"{explicit}: {'; '.join(violations)}",
                            rec.cuda_graph_safe if rec else False)
            others = tuple(_candidate(r, v, None, False) for r, v in checked if r is not rec)
            alt = ", ".join(alternatives) or "none"
            return RoleChoice(role, None, False,
                              f"explicitly requested {explicit} cannot serve {role.value}: "
                              f"{'; '.join(violations)}; backends that would serve: {alt}",
                              (bad, *others), None)
        chosen = rec
    else:
        chosen = next((r for r, v in checked if not v), None)
    cands = tuple(_candidate(r, v, chosen, explicit is None) for r, v in checked)
    if chosen is None:
        return RoleChoice(role, None, True,
                          f"no registered backend can serve {role.value} here", cands, None)
    return RoleChoice(role, chosen.name, explicit is None,
                      _taken_reason(chosen, explicit is None, rt.kv_format), cands, chosen)


def _candidate(r: BackendRecord, violations: list[str], chosen: BackendRecord | None,
               automatic: bool) -> Candidate:
    if violations:
        return Candidate(r.name, "rejected", tuple(violations),
                         f"{r.name}: {'; '.join(violations)}", r.cuda_graph_safe)
    if r is chosen:
        how = "chosen automatically" if automatic else "explicitly requested"
        return Candidate(r.name, "taken", (), f"{r.name}: taken ({how})", r.cuda_graph_safe)
    if chosen is None:  # the explicit choice failed; this one would serve
        return Candidate(r.name, "serves", (), f"{r.name}: would serve", r.cuda_graph_safe)
    why = f"{chosen.name} is preferred" if automatic else f"{chosen.name} was explicitly requested"
    return Candidate(r.name, "serves", (), f"{r.name}: serves, but {why}", r.cuda_graph_safe)


def _warnings(model: MLAConfig, rt: Runtime, choices: list[RoleChoice]) -> list[str]:
    out: list[str] = []
    roles = {c.role for c in choices}
    if model.is_sparse and Role.DENSE_DECODE in roles:
        out.append(
            f"dense_decode on a DSA model ({model.name}): beyond index_topk={model.index_topk} "
            "tokens of context it attends to every token instead of the indexer's top-k, so it "
            "no longer computes the model's attention")
    if model.is_sparse and Role.DENSE_PREFILL in roles:
        out.append(
            f"dense_prefill on a DSA model ({model.name}): exact only for prompts of at most "
            f"index_topk={model.index_topk} tokens")
    for c in choices:
        if c.record is None:
            continue
        if c.record.tier == Tier.REFERENCE:
            out.append(f"{c.role.value} runs on the float32 reference: correct but orders of "
                       "magnitude slower than a kernel, host-synchronising, not CUDA-graph safe")
        elif not c.record.cuda_graph_safe:
            out.append(f"{c.role.value}: {c.backend} is not CUDA-graph safe")
    for c in choices:
        if not c.served:
            out.append(f"{c.role.value} cannot be served: {c.reason}")
    return out


def resolve(
    model: MLAConfig | str | Mapping,
    runtime: Runtime,
    choices: Mapping[Role | str, str | None] | None = None,
    *,
    strict: bool = True,
    exclude: Iterable[str] = (),
    probe: Probe = probe_available,
) -> Plan:
    """Pick one backend per role the model needs, explaining every candidate.

    ``model``: an `MLAConfig`, a preset name, or a config.json path / dict. ``choices``: role →
    backend name for explicit choices (None values ignored). ``strict``: an explicit choice
    that cannot serve raises `BackendChoiceError` (else the role is left unserved, with the
    reasons). ``exclude``: backend names never chosen automatically (rejected with "excluded
    by the user"). ``probe``: availability check (tests substitute one).

    Raises ValueError for unknown roles/backends, a TP size that does not split the heads, or a
    choice for a role the model does not use.
    """
    model = resolve_model(model)
    rank = model.split_tp(runtime.tp_size)
    explicit: dict[Role, str] = {}
    for role, name in (choices or {}).items():
        if name is None:
            continue
        role = parse_role(role)
        if name not in backend_names():
            raise ValueError(f"{role.value}_backend: unknown backend {name!r}; valid: "
                             f"{', '.join(backend_names())}")
        explicit[role] = name
    excluded = frozenset(exclude)
    for name in excluded:
        if name not in backend_names():
            raise ValueError(f"exclude: unknown backend {name!r}; valid: "
                             f"{', '.join(backend_names())}")
    if model.is_sparse and Role.DENSE_DECODE in explicit and Role.SPARSE_DECODE in explicit:
        raise ValueError("dense_decode_backend, sparse_decode_backend: decode runs on one of "
                         f"them, got both ({explicit[Role.DENSE_DECODE]}, "
                         f"{explicit[Role.SPARSE_DECODE]}); give only one")
    roles = needed_roles(model, explicit)
    for role in explicit:
        if role not in roles:
            kind = "a DSA" if model.is_sparse else "a dense MLA"
            raise ValueError(f"{role.value}_backend: {model.name} is {kind} model, it has no "
                             f"{role.value} role (roles: {', '.join(r.value for r in roles)})")
    picked = [_resolve_role(r, rank, runtime, explicit.get(r), probe, excluded - {explicit.get(r)},
                            strict) for r in roles]
    return Plan(model, rank, runtime, tuple(picked), tuple(_warnings(model, runtime, picked)))
