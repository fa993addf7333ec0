"""NaN/Inf diagnosis mode: with ``FP8MLA_CHECK=1`` in the environment (or `enable`), every
attention call validates its inputs — q, the cache rows it will read, the fp8 scales — and its
outputs, and raises `NumericsError` naming the op, the layer (inside `layer_scope`), the request
and the position, instead of letting a NaN surface later as a device-side assert in sampling.
The FlashMLA / DeepGEMM entry points (`fp8mla.compat`), which trust their lengths and block
tables as those libraries do, then also validate them on the host (a length past its table or
a page outside the pool: an error naming it, not a read outside the pool).

Off by default; when off the cost is one environment lookup per call. When on, each call
synchronises with the host and dequantizes the rows it reads (a debugging mode, not for CUDA
graphs).
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import torch

from fp8mla.formats import KVFormat, dequantize_kv

__all__ = ["NumericsError", "enabled", "enable", "layer_scope", "check_attention_inputs",
           "check_attention_outputs"]

_FORCED: bool | None = None
_LAYER: contextvars.ContextVar[int | None] = contextvars.ContextVar("fp8mla_layer", default=None)


class NumericsError(FloatingPointError):
    """A NaN/Inf (or a non-positive scale) found by the diagnosis mode."""


def enabled() -> bool:
    """True when the diagnosis mode is on (`enable`, else ``FP8MLA_CHECK=1``)."""
    if _FORCED is not None:
        return _FORCED
    return os.environ.get("FP8MLA_CHECK", "0") == "1"


def enable(on: bool | None = True) -> None:
    """Force the mode on/off for this process; ``None`` returns control to FP8MLA_CHECK."""
    global _FORCED
    _FORCED = on


@contextlib.contextmanager
def layer_scope(layer: int):
    """Name ``layer`` in every diagnosis raised inside the block."""
    token = _LAYER.set(layer)
    try:
        yield
    finally:
        _LAYER.reset(token)


def _where(op: str) -> str:
    layer = _LAYER.get()
    return f"{op}" + (f" (layer {layer})" if layer is not None else "")


def _first_bad(t: torch.Tensor) -> list[int] | None:
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    return torch.nonzero(bad)[0].tolist()


def check_attention_inputs(op: str, q: torch.Tensor, rows: torch.Tensor, fmt: KVFormat,
                           slots: list[torch.Tensor], fp8_scale: torch.Tensor | None) -> None:
    """q: any float dtype (bf16 from the kernels' callers) [requests, ..., 576]; rows: uint8
    [num_slots, row_bytes]; slots[r]: int32 / int64 [n_r], the slots request (or query) r
    reads, in its own order; fp8_scale: float32 [1] (the ``fp8`` format's) or None. Raises
    NumericsError at the first bad value."""
    where = _where(op)
    bad = _first_bad(q.float())
    if bad is not None:
        raise NumericsError(f"{where}: q has a non-finite value at request {bad[0]}, index "
                            f"{bad[1:]}: {q[tuple(bad)].item()}")
    if fmt.name == "fp8" and fp8_scale is not None:
        s = float(fp8_scale.reshape(-1)[0])
        if not (s > 0 and s < float("inf")):
            raise NumericsError(f"{where}: fp8_scale must be finite and > 0, got {s}")
    for r, sl in enumerate(slots):
        if sl.numel() == 0:
            continue
        got = rows[sl.long()]
        if fmt.name == "fp8_ds_mla":
            scales = got[:, 512:528].contiguous().view(torch.float32)
            ok = torch.isfinite(scales) & (scales > 0)
            if not bool(ok.all()):
                i, t = torch.nonzero(~ok)[0].tolist()
                raise NumericsError(f"{where}: request {r}, position {i} (slot {int(sl[i])}): "
                                    f"scale {t} is {scales[i, t].item()} (must be finite, > 0)")
        vals = dequantize_kv(got, fmt, 1.0 if fp8_scale is None else fp8_scale)
        bad = _first_bad(vals)
        if bad is not None:
            i, d = bad
            raise NumericsError(f"{where}: request {r}, position {i} (slot {int(sl[i])}): cache "
                                f"value {d} is {vals[i, d].item()}")


def check_attention_outputs(op: str, out: torch.Tensor, lse: torch.Tensor,
                            empty_lse: float = float("-inf")) -> None:
    """out: bf16 (any float dtype) [requests, ..., 512]; lse: float32 [requests, ...]
    (``empty_lse`` allowed — −inf, or FlashMLA's +inf: nothing attended)."""
    where = _where(op)
    bad = _first_bad(out.float())
    if bad is not None:
        raise NumericsError(f"{where}: output is {out[tuple(bad)].item()} at request {bad[0]}, "
                            f"index {bad[1:]}")
    bad_lse = torch.isnan(lse) | ((lse == float("inf")) & (empty_lse != float("inf")))
    if bool(bad_lse.any()):
        pos = torch.nonzero(bad_lse)[0].tolist()
        raise NumericsError(f"{where}: lse is {lse[tuple(pos)].item()} at request {pos[0]}, "
                            f"index {pos[1:]}")
