"""Backend registry and explainable resolution (issue 5).

- `records`: `BackendRecord` (frozen capability record), `Role`, `IntSet`, `Problem`.
- `registry`: `REGISTRY`, the registered backends with cited constraints.
- `resolver`: `resolve(model, runtime, choices)` → `Plan`, `Runtime`, `BackendChoiceError`.

Importing this package imports neither torch nor triton nor any backend.
"""

from fp8mla.backends.records import (
    KV_FORMATS,
    ROLES,
    BackendRecord,
    IntSet,
    Problem,
    Role,
    Tier,
    probe_available,
)
from fp8mla.backends.registry import (
    REGISTRY,
    backend_names,
    candidates_for,
    record_for,
    records_for,
)
from fp8mla.backends.resolver import (
    BackendChoiceError,
    Candidate,
    Plan,
    RoleChoice,
    Runtime,
    needed_roles,
    parse_role,
    resolve,
)

__all__ = [
    "KV_FORMATS", "ROLES", "BackendRecord", "IntSet", "Problem", "Role", "Tier",
    "probe_available", "REGISTRY", "backend_names", "candidates_for", "record_for",
    "records_for", "BackendChoiceError", "Candidate", "Plan", "RoleChoice", "Runtime",
    "needed_roles", "parse_role", "resolve",
]
