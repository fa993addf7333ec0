"""Shared input checks: errors name the argument, what was expected and what came."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch


@contextmanager
def argument_names(names: dict[str, str]) -> Iterator[None]:
    """Re-raise a TypeError / ValueError from inside whose message starts with an argument's
    name (``name: ...``) under the caller's name for it (``names``: callee's → caller's), so a
    wrapper's errors name what its own caller passed."""
    try:
        yield
    except (TypeError, ValueError) as e:  # renamed in place: type, traceback and chain kept
        if len(e.args) == 1 and isinstance(e.args[0], str):
            head, sep, rest = e.args[0].partition(":")
            if sep and head in names:  # "q: ..."
                e.args = (f"{names[head]}{sep}{rest}",)
            elif sep:  # "index heads (q.shape[-2]): ..."
                for old, new in names.items():
                    head = head.replace(f"({old}.", f"({new}.")
                e.args = (f"{head}{sep}{rest}",)
        raise


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    ndim: int | None = None,
    device: torch.device | None = None,
    contiguous_last: bool = False,
) -> torch.Tensor:
    """Raise TypeError/ValueError unless ``t`` is a tensor of the given dtype(s) and shape
    (``None`` entries in ``shape`` match any size). Returns ``t``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            want = " or ".join(str(d).replace("torch.", "") for d in allowed)
            raise TypeError(f"{name}: expected dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    if shape is not None:
        have = tuple(t.shape)
        ok = have == tuple(shape) or (len(have) == len(shape) and all(
            s is None or s == d for s, d in zip(shape, have, strict=True)))
        if not ok:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {list(t.shape)}")
    if device is not None and t.device != device and not same_device(t.device,
                                                                    torch.device(device)):
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if contiguous_last and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected a contiguous last dimension, got strides {t.stride()}")
    return t


def check_fp8_scale(fp8_scale: torch.Tensor | None, device: torch.device,
                    validate: bool) -> None:
    """fp8_scale, where given: float32 [1] on ``device``; with ``validate`` (a host sync; the
    callers pass it for the ``fp8`` format, whose scale it is) also finite and > 0 (a zero,
    negative or NaN scale turns every value into garbage)."""
    if fp8_scale is None:
        return
    check_tensor("fp8_scale", fp8_scale, dtype=torch.float32, shape=(1,), device=device)
    if validate:
        value = float(fp8_scale)
        if not 0.0 < value < float("inf"):
            raise ValueError(f"fp8_scale: expected a finite value > 0, got {value}")


def same_device(a: torch.device, b: torch.device) -> bool:
    """Equal devices, with an index-less ``cuda`` meaning the current CUDA device."""
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    cur = torch.cuda.current_device
    return (a.index if a.index is not None else cur()) == (b.index if b.index is not None else cur())


def check_int(name: str, value: object, *, lo: int | None = None, hi: int | None = None) -> int:
    """An int within [lo, hi], or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name}: expected an int in {rng}, got {value}")
    return value


def check_slot_range(name: str, slots: torch.Tensor, num_slots: int) -> None:
    """Every entry of ``slots`` in [-1, num_slots) (−1 skips), or a ValueError naming ``name``
    and the first offending extreme. Reads the tensor on the host (a device sync)."""
    if not slots.numel():
        return
    lo, hi = int(slots.min()), int(slots.max())
    if lo < -1 or hi >= num_slots:
        raise ValueError(f"{name}: expected slots in [-1, {num_slots}) (−1 skips), got "
                         f"{lo if lo < -1 else hi}")


def check_pow2(name: str, value: object, lo: int, hi: int) -> int:
    """A power of two within [lo, hi], or an error naming ``name``."""
    check_int(name, value, lo=lo, hi=hi)
    if value & (value - 1):
        raise ValueError(f"{name}: expected a power of two in [{lo}, {hi}], got {value}")
    return value


MAX_PAGE_SIZE = 256


def is_page_size(value: int) -> bool:
    """Whether ``value`` is a page size the kernels take: a power of two in [1, MAX_PAGE_SIZE]."""
    return 1 <= value <= MAX_PAGE_SIZE and not value & (value - 1)


def check_page_size(page_size: object, name: str = "page_size") -> int:
    return check_pow2(name, page_size, 1, MAX_PAGE_SIZE)
