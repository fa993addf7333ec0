"""Backends as data: what each attention kernel supports, as frozen records.

A `BackendRecord` states one backend's support for one or more roles that share the same
constraints (FlashMLA has one record for dense decode and one for sparse attention, because the
two kernels accept different formats, head counts and GPUs). `BackendRecord.violations` lists,
in words a user can act on, every constraint a given problem breaks; the resolver reads only
these records. Availability (is the code importable here?) is probed lazily, never at import
time of fp8mla.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass, field
from enum import Enum

from fp8mla.gpus import format_cc

__all__ = [
    "Role",
    "ROLES",
    "DECODE_ROLES",
    "KV_FORMATS",
    "Tier",
    "IntSet",
    "Problem",
    "BackendRecord",
    "probe_available",
]


class Role(str, Enum):
    """The attention jobs of an MLA / DSA layer."""

    DENSE_PREFILL = "dense_prefill"
    DENSE_DECODE = "dense_decode"
    SPARSE_PREFILL = "sparse_prefill"
    SPARSE_DECODE = "sparse_decode"
    INDEXER = "indexer"
    TOPK = "topk"

    def __str__(self) -> str:
        return self.value


ROLES: tuple[Role, ...] = tuple(Role)
#: Roles that run on every decode step (the cost model prices these).
DECODE_ROLES = frozenset({Role.DENSE_DECODE, Role.SPARSE_DECODE, Role.INDEXER, Role.TOPK})
#: KV cache formats (docs/DESIGN.md §3): bytes per token 1152 / 576 / 656.
KV_FORMATS: tuple[str, ...] = ("bf16", "fp8", "fp8_ds_mla")


class Tier(int, Enum):
    """Preference tiers, best first: fp8mla's own kernels read FP8 directly; external kernels
    next; baselines only when nothing else serves; the float32 reference last."""

    NATIVE = 0
    EXTERNAL = 1
    BASELINE = 2
    REFERENCE = 3


@dataclass(frozen=True)
class IntSet:
    """A set of allowed integers: an inclusive range ``[lo, hi]`` (``hi=None``: unbounded), or an
    explicit ``values`` set (which wins when given). ``IntSet()`` allows any value >= 1."""

    lo: int = 1
    hi: int | None = None
    values: frozenset[int] | None = None

    @classmethod
    def of(cls, *values: int) -> IntSet:
        """Exactly these values."""
        return cls(values=frozenset(values))

    @classmethod
    def powers_of_two(cls, lo: int, hi: int) -> IntSet:
        """Powers of two in ``[lo, hi]``."""
        return cls(values=frozenset(1 << i for i in range(hi.bit_length()) if lo <= 1 << i <= hi))

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        if self.values is not None:
            return value in self.values
        return value >= self.lo and (self.hi is None or value <= self.hi)

    @property
    def is_any(self) -> bool:
        return self.values is None and self.lo <= 1 and self.hi is None

    def describe(self) -> str:
        """Human form: ``"64"``, ``"64 or 128"``, ``"one of 1, 2, 4"``, ``"1-128"``, ``"any"``."""
        if self.values is not None:
            vals = sorted(self.values)
            if len(vals) == 1:
                return str(vals[0])
            if len(vals) == 2:
                return f"{vals[0]} or {vals[1]}"
            return "one of " + ", ".join(map(str, vals))
        if self.hi is None:
            return "any" if self.lo <= 1 else f">= {self.lo}"
        return f"{self.lo}-{self.hi}"

    def to_json(self) -> dict:
        if self.values is not None:
            return {"values": sorted(self.values)}
        return {"min": self.lo, "max": self.hi}


ANY = IntSet()


@dataclass(frozen=True)
class Problem:
    """What one role must run, per rank: the facts a record is checked against.

    ``num_heads`` is per rank (model heads / tp_size); ``index_n_heads`` is not split by TP.
    ``compute_capability`` is e.g. 120; ``device`` names it for messages.
    """

    role: Role
    kv_format: str
    num_heads: int
    page_size: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    s_q: int
    compute_capability: int
    device: str = ""
    tp_size: int = 1
    index_n_heads: int = 0
    index_head_dim: int = 0


@dataclass(frozen=True)
class BackendRecord:
    """One backend's support for ``roles``.

    ``entry_point``: ``"module"`` or ``"module:attr"`` whose presence makes the backend available
    (None: always available). ``compute_capabilities``: None means any device the backend runs
    on (``needs_cuda`` says whether that includes CPU). ``hints``: (constraint, why) pairs that
    explain a rejection. ``source``: where the constraints come from (citations).
    """

    name: str
    roles: frozenset[Role]
    tier: Tier
    priority: int
    kv_formats: frozenset[str]
    num_heads: IntSet = ANY
    page_sizes: IntSet = ANY
    kv_lora_rank: IntSet = ANY
    qk_rope_head_dim: IntSet = ANY
    qk_nope_head_dim: IntSet = ANY
    s_q: IntSet = ANY
    index_n_heads: IntSet = ANY
    index_head_dim: IntSet = ANY
    compute_capabilities: frozenset[int] | None = None
    cuda_graph_safe: bool = False
    needs_cuda: bool = True
    entry_point: str | None = None
    install_hint: str = ""
    description: str = ""
    source: str = ""
    hints: tuple[tuple[str, str], ...] = field(default=())

    def hint(self, constraint: str) -> str:
        """The why for one constraint (``" (why)"``), or ``""``."""
        for key, text in self.hints:
            if key == constraint:
                return f" ({text})"
        return ""

    def violations(self, p: Problem) -> list[str]:
        """Every constraint of this record that ``p`` breaks, in actionable words (without the
        backend's name); empty when the record serves ``p``. Availability is not checked here
        (see `probe_available`)."""
        out: list[str] = []
        if p.role not in self.roles:
            have = ", ".join(sorted(r.value for r in self.roles))
            return [f"does not implement {p.role.value} (implements: {have})"]
        if p.kv_format not in self.kv_formats:
            allowed = " or ".join(f for f in ("bf16", "fp8", "fp8_ds_mla") if f in self.kv_formats)
            out.append(f"kv_format must be {allowed}, got {p.kv_format}{self.hint('kv_format')}")
        attention = p.role not in (Role.INDEXER, Role.TOPK)
        if attention and p.num_heads not in self.num_heads:
            split = f" = {p.num_heads * p.tp_size} heads / tp {p.tp_size}" if p.tp_size > 1 else ""
            out.append(f"num_heads per rank must be {self.num_heads.describe()}, got "
                       f"{p.num_heads}{split}{self.hint('num_heads')}")
        if p.page_size not in self.page_sizes:
            out.append(f"page_size must be {self.page_sizes.describe()}, got {p.page_size}"
                       f"{self.hint('page_size')}")
        if attention:
            for name, allowed, got in (
                ("kv_lora_rank", self.kv_lora_rank, p.kv_lora_rank),
                ("qk_rope_head_dim", self.qk_rope_head_dim, p.qk_rope_head_dim),
                ("qk_nope_head_dim", self.qk_nope_head_dim, p.qk_nope_head_dim),
            ):
                if got not in allowed:
                    out.append(f"{name} must be {allowed.describe()}, got {got}{self.hint(name)}")
        per_step = p.role in (Role.DENSE_DECODE, Role.SPARSE_DECODE, Role.INDEXER)
        if per_step and p.s_q not in self.s_q:
            out.append(f"s_q must be {self.s_q.describe()}, got {p.s_q}{self.hint('s_q')}")
        if p.role == Role.INDEXER:
            if p.index_n_heads not in self.index_n_heads:
                out.append(f"index_n_heads must be {self.index_n_heads.describe()}, got "
                           f"{p.index_n_heads}{self.hint('index_n_heads')}")
            if p.index_head_dim not in self.index_head_dim:
                out.append(f"index_head_dim must be {self.index_head_dim.describe()}, got "
                           f"{p.index_head_dim}{self.hint('index_head_dim')}")
        ccs_ok = self.compute_capabilities
        if ccs_ok is not None and p.compute_capability not in ccs_ok:
            ccs = sorted(self.compute_capabilities)
            allowed = " or ".join(map(format_cc, ccs)) if len(ccs) <= 3 else \
                "one of " + ", ".join(map(format_cc, ccs))
            dev = f" ({p.device})" if p.device and p.device != format_cc(p.compute_capability) \
                else ""
            out.append(f"compute capability must be {allowed}, got "
                       f"{format_cc(p.compute_capability)}{dev}{self.hint('compute_capability')}")
        return out

    def capabilities_json(self) -> dict:
        """The record as plain JSON data."""
        return {
            "name": self.name,
            "roles": sorted(r.value for r in self.roles),
            "tier": self.tier.name.lower(),
            "kv_formats": sorted(self.kv_formats),
            "num_heads": self.num_heads.to_json(),
            "page_sizes": self.page_sizes.to_json(),
            "kv_lora_rank": self.kv_lora_rank.to_json(),
            "qk_rope_head_dim": self.qk_rope_head_dim.to_json(),
            "qk_nope_head_dim": self.qk_nope_head_dim.to_json(),
            "s_q": self.s_q.to_json(),
            "compute_capabilities": None if self.compute_capabilities is None
            else sorted(self.compute_capabilities),
            "cuda_graph_safe": self.cuda_graph_safe,
            "needs_cuda": self.needs_cuda,
            "entry_point": self.entry_point,
            "source": self.source,
        }


def _module_defines(module: str, attr: str) -> bool:
    """Whether ``module`` defines ``attr``: by hasattr when it is already imported, else by
    reading its source (top-level defs, assignments, imports, ``__all__``) without executing
    it — importing fp8mla.ops would load torch and triton (seconds)."""
    mod = sys.modules.get(module)
    if mod is not None:
        return hasattr(mod, attr)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return spec is not None and not attr
    try:
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == attr:
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == attr for a in node.names):
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return True
    return False


def probe_available(record: BackendRecord) -> str | None:
    """None when ``record``'s code is present here, else why not (without the backend name).

    External modules are looked up with importlib.util.find_spec (nothing is imported); fp8mla's
    own kernels by `_module_defines`.
    """
    if record.entry_point is None:
        return None
    module, _, attr = record.entry_point.partition(":")
    if module.startswith("fp8mla."):
        if attr and _module_defines(module, attr):
            return None
        if not attr and importlib.util.find_spec(module) is not None:
            return None
        what = attr or module
        roles = "/".join(sorted(r.value for r in record.roles))
        return f"{roles} kernel not implemented in this version ({module}.{what} is missing)" \
            if attr else f"{what} is missing in this version"
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    hint = f"; {record.install_hint}" if record.install_hint else ""
    return f"module {module} is not installed here{hint}"
