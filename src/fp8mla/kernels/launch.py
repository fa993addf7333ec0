"""Kernel launches that skip Triton's per-call specialization once a kernel has compiled.

``jit_fn[grid](*args, **kwargs)`` costs tens of µs of host time per call (H200 host, triton
3.6: two thirds of an eager decode call's 52–132 µs, `benchmarks/host_overhead.py`): Triton
binds and specializes every argument (its type, a pointer's 16-byte alignment, an integer's
range, divisibility by 16 and whether it is 1), turns that into a cache key and looks the
compiled kernel up, before its C launcher runs. ``fast(jit_fn)[grid](...)`` does the same
launch: its first call with a given argument shape goes through Triton (compiling where
needed) and keeps the compiled kernel under a key at least as fine as Triton's — constexprs by
value, tensors by dtype and address mod 16, integers by Triton's classes, floats by type,
tensor descriptors by every field but the base address — so later calls with that key
hand their arguments straight to the compiled kernel's launcher (``CompiledKernel.run``, the
same call Triton's ``JITFunction.run`` ends in, in triton 3.4 through 3.9).

Both paths launch on the device of the call's first tensor argument (`_tensor_device`): Triton
launches on the *current* CUDA device, so a plan on ``cuda:1`` run while ``cuda:0`` is current
would run there, on cuda:0's stream, unordered with the tensors' own; the launcher makes the
tensors' device current for the call where it is not (one comparison a call otherwise). A
compiled kernel's call over CPU tensors (TRITON_INTERPRET unset, or set after triton was
imported) raises `fp8mla.runtime.needs_cuda`'s error before either path.

Both paths compile with `OPTIONS`: floating-point contraction (FMA) on, asked for explicitly.
It is Triton's default through 3.9, which every kernel was tuned and tested with; 3.9 warns that
3.10 turns the default off (``TRITON_DEFAULT_FP_FUSION``), which would compile every
``a * b + c`` as two roundings and more instructions. ``TRITON_FORCE_DISABLE_FP_FUSION=1``
still turns it off.

Not done on the fast path: Triton's pre-run hooks and its check that the globals a kernel read
at compile time have not changed (fp8mla's kernels read only constant globals). Under the
interpreter, or with `FAST_LAUNCH` off, every call is Triton's own; so is every later call of a
kernel whose compiled launcher refused the fast path's arguments (a TypeError: a Triton whose
launcher is called differently).

H200 host (triton 3.6, `benchmarks/host_overhead.py`, 200 eager calls, medians of 5 rounds
alternating with Triton's path; session 37: −19 to −36% in three runs, BENCHMARKS.md; the
second, h200-20261204-s37-e3a61e4-host-overhead.json), host µs a call, Triton's path → this
one: fp8 B=1 × 128K × 8 heads (decode + combine) 193.3 → 145.6, B=64 × 8K × 16 137.0 → 105.5,
B=64 × 8K × 128 (one launch) 133.6 → 103.8, fp8_ds_mla B=1 × 128K × 8 151.1 → 110.6, sparse
B=64 × 8 228.5 → 146.4, B=128 × 128 122.8 → 80.8.
"""

from __future__ import annotations

import inspect

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

from fp8mla.runtime import needs_cuda

__all__ = ["FAST_LAUNCH", "OPTIONS", "FastLauncher", "fast"]

# False: every launch through Triton's own path (benchmarks/host_overhead.py A/Bs it)
FAST_LAUNCH = True
# compile options of every launch (a call's own keyword arguments take precedence)
OPTIONS = {"enable_fp_fusion": True}
MAX_KERNELS = 256  # keys kept a kernel function; past this the cache starts again
_INT32, _INT64 = 2**31, 2**63


def _int_class(v: int) -> tuple:
    """The facts Triton specializes an integer argument on: whether it is 1, whether it
    divides by 16, its type by range (int32, int64, uint64)."""
    return (v == 1, not v & 15, -_INT32 <= v < _INT32, -_INT64 <= v < _INT64)


def _arg_key(v):
    """One non-constexpr argument's part of the key (`FastLauncher._key` inlines the common
    cases: exact tensors, ints and floats)."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() & 15)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return _int_class(v)
    if isinstance(v, float):
        return float
    if hasattr(v, "block_shape") and hasattr(v, "base"):  # a host tensor descriptor
        return (type(v), v.base.dtype, v.base.data_ptr() & 15, tuple(v.shape),
                tuple(v.strides), tuple(v.block_shape), getattr(v, "layout", None),
                getattr(v, "padding", None))
    return (type(v), v)  # anything else by value (hashable, or the key raises: Triton's path)


class FastLauncher:
    """``fn[grid](...)`` with the compiled kernel kept per argument key (module docstring).
    fn: a ``triton.jit`` or ``gluon.jit`` function; anything else (the interpreter's) is
    launched as it is."""

    def __init__(self, fn):
        self.fn = fn
        self.jitted = isinstance(fn, JITFunction)
        params = fn.params if self.jitted else []
        self.names = [p.name for p in params]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.constexpr = [p.is_constexpr for p in params]
        self.defaults = [p.default for p in params]
        self.kernels: dict = {}
        self.hits = 0  # launches that skipped Triton's path (tests read it)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return self.launch(grid, args, kwargs)
        return launch

    def _values(self, args: tuple, kwargs: dict) -> list | None:
        """Every parameter's value in order (defaults filled in); None where there are more
        positional arguments than parameters or one without a default is missing (Triton's
        path then raises its own error)."""
        n = len(args)
        if n > len(self.names):
            return None
        values = list(args)
        for i in range(n, len(self.names)):
            name = self.names[i]
            if name in kwargs:
                values.append(kwargs[name])
            elif self.defaults[i] is not inspect.Parameter.empty:
                values.append(self.defaults[i])
            else:
                return None
        return values

    def _key(self, device: int, values: list, kwargs: dict):
        """The key of one call: `_arg_key` of each argument, constexprs by value, the launch
        options, the knob Triton specializes every launch on (``knobs.runtime.debug``); the
        common types inline (this loop is most of the fast path's own cost)."""
        tensor, i32, i64 = torch.Tensor, _INT32, _INT64
        options = tuple([(k, v) for k, v in kwargs.items() if k not in self.index])
        return (device, tuple([
            v if c
            else (v.dtype, v.data_ptr() & 15) if type(v) is tensor
            else (v == 1, not v & 15, -i32 <= v < i32, -i64 <= v < i64) if type(v) is int
            else float if type(v) is float
            else _arg_key(v)
            for v, c in zip(values, self.constexpr, strict=True)]), options, knobs.runtime.debug)

    def launch(self, grid, args: tuple, kwargs: dict):
        """Launch ``fn`` over ``grid`` (a tuple of 1–3 ints) on the device of the first tensor
        argument (`_tensor_device`), made current for the call where another is; returns
        Triton's compiled kernel on its path, None on the fast one."""
        device = _tensor_device(args)
        if device < 0:  # CPU tensors (the interpreter) or none: the current device's
            if self.jitted and device == _CPU:  # compiled for a GPU: it cannot read them
                raise needs_cuda(torch.device("cpu"))
            return self._launch(grid, args, kwargs, None)
        if device != torch.cuda.current_device():
            with torch.cuda.device(device):
                return self._launch(grid, args, kwargs, device)
        return self._launch(grid, args, kwargs, device)

    def _launch(self, grid, args: tuple, kwargs: dict, device: int | None):
        """`launch` on ``device``, the current one (its index; None: not yet read)."""
        if not (FAST_LAUNCH and self.jitted):
            return self._triton(grid, args, kwargs)
        values = self._values(args, kwargs)
        if device is None:
            device = torch.cuda.current_device()
        try:
            key = None if values is None else self._key(device, values, kwargs)
            kernel = self.kernels.get(key) if key is not None else None
        except TypeError:  # an unhashable argument
            key = kernel = None
        if kernel is None:
            kernel = self._triton(grid, args, kwargs)
            if key is not None and kernel is not None:
                if len(self.kernels) >= MAX_KERNELS:
                    self.kernels.clear()
                self.kernels[key] = kernel
            return kernel
        stream = _raw_stream(device)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        hooks = knobs.runtime
        try:
            kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata,
                       kernel.launch_metadata(grid, stream, *values), hooks.launch_enter_hook,
                       hooks.launch_exit_hook, *values)
        except TypeError:
            if self.hits:  # it launched this way before: the error is not the call's shape
                raise
            # a launcher whose call differs (a Triton other than 3.4–3.9): it refused the
            # arguments before launching; Triton's path from now on
            self.jitted = False
            return self._triton(grid, args, kwargs)
        self.hits += 1
        return None

    def _triton(self, grid, args: tuple, kwargs: dict):
        """Triton's own launch path (compiling where needed), with `OPTIONS`."""
        return self.fn[grid](*args, **{**OPTIONS, **kwargs})


_CPU, _NO_TENSOR = -1, -2


def _tensor_device(args: tuple) -> int:
    """The CUDA device index of the first tensor in ``args`` (every fp8mla kernel takes a
    tensor first: the device of all of them); `_CPU` where it is on the CPU, `_NO_TENSOR`
    where there is none."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.get_device()
    return _NO_TENSOR


def _raw_stream(device: int) -> int:
    """The current CUDA stream's handle on ``device`` (as Triton's launch path takes it)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(device) if get is not None else torch.cuda.current_stream(device).cuda_stream


_LAUNCHERS: dict = {}


def fast(fn) -> FastLauncher:
    """The `FastLauncher` of kernel function ``fn`` (one per function, kept)."""
    launcher = _LAUNCHERS.get(fn)
    if launcher is None:
        launcher = _LAUNCHERS[fn] = FastLauncher(fn)
    return launcher
