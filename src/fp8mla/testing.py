"""Comparison helper for tests and benchmarks' correctness checks."""

from __future__ import annotations

import torch

__all__ = ["assert_close", "TOLERANCES"]

# (atol, rtol) per output dtype of the kernel under test.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float | None = None,
    rtol: float | None = None, min_cosine: float = 0.9999, name: str = "output",
) -> None:
    """Check ``actual`` against a float32 ``expected``.

    NaN and ±Inf positions (and the sign of infinities) must match exactly; finite elements must
    satisfy |a − e| <= atol + rtol·|e|; the cosine similarity of the finite parts must reach
    ``min_cosine``. The tolerances default to the row of `TOLERANCES` for actual's dtype. On
    failure the message gives the worst element, its index and the counts.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {list(actual.shape)} != expected {list(expected.shape)}")
    d_atol, d_rtol = TOLERANCES.get(actual.dtype, TOLERANCES[torch.float32])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a = actual.detach().float().cpu()
    e = expected.detach().float().cpu()
    for label, fa, fe in (("NaN", a.isnan(), e.isnan()), ("+Inf", a == float("inf"),
                          e == float("inf")), ("-Inf", a == float("-inf"), e == float("-inf"))):
        if not torch.equal(fa, fe):
            where = torch.nonzero(fa != fe)[0].tolist()
            raise AssertionError(
                f"{name}: {label} positions differ ({int(fa.sum())} in actual, {int(fe.sum())} "
                f"expected); first mismatch at {where}: actual {a[tuple(where)].item()}, "
                f"expected {e[tuple(where)].item()}"
            )
    finite = e.isfinite()
    if not finite.any():
        return
    af, ef = a[finite], e[finite]
    err = (af - ef).abs()
    excess = err - (atol + rtol * ef.abs())
    worst = int(excess.argmax())
    if excess[worst] > 0:
        idx = torch.nonzero(finite)[worst].tolist()
        n_bad = int((excess > 0).sum())
        raise AssertionError(
            f"{name}: {n_bad}/{af.numel()} elements outside atol={atol:g} rtol={rtol:g}; worst at "
            f"{idx}: actual {af[worst].item():.6g}, expected {ef[worst].item():.6g} "
            f"(|diff| {err[worst].item():.3g}); max |diff| {err.max().item():.3g}"
        )
    denom = af.norm() * ef.norm()
    if denom > 0:
        cos = float((af.double() @ ef.double()) / denom.double())
        if cos < min_cosine:
            raise AssertionError(f"{name}: cosine similarity {cos:.6f} < {min_cosine}")
