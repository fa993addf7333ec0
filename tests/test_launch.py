"""`fp8mla.kernels.launch`: which calls reuse a compiled kernel and which go back to Triton.

On the CPU machine no kernel launches: a real ``JITFunction`` whose Triton path (``run``) is
replaced by a recorder stands in, and the compiled kernel it returns records the launcher
calls the fast path makes. The GPU tests (test_launch_gpu.py) launch real kernels both ways.
"""

import contextlib

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from fp8mla.kernels import launch


def _toy(x_ptr, out_ptr, n, scale, flag, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 3,
         opt_ptr=None):
    pass


class FakeKernel:
    """A compiled kernel's launcher surface: records ``run``'s calls."""

    function = "fn-handle"
    packed_metadata = "meta"

    def __init__(self):
        self.calls = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.calls.append(args)


@pytest.fixture
def toy(monkeypatch):
    """(launcher, Triton-path calls, compiled kernels made) for a fresh ``_toy`` JITFunction."""
    fn = JITFunction(_toy)
    triton_calls, kernels = [], []

    def triton_path(*args, grid, warmup, **kwargs):
        triton_calls.append((grid, args, kwargs))
        kernels.append(FakeKernel())
        return kernels[-1]

    monkeypatch.setattr(fn, "run", triton_path)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "_raw_stream", lambda device: 1234)
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    monkeypatch.setattr(launch, "_tensor_device", lambda args: 0)  # CPU tensors stand for cuda:0's
    return launch.FastLauncher(fn), triton_calls, kernels


def _args(x, out, n=100, scale=0.5, flag=True):
    return (x, out, n, scale, flag)


def test_second_call_reuses_the_compiled_kernel_with_every_argument(toy):
    launcher, triton_calls, kernels = toy
    x, out = torch.zeros(64), torch.zeros(64)
    launcher[(4,)](*_args(x, out), BLOCK=32, num_warps=4)
    assert len(triton_calls) == 1 and launcher.hits == 0
    y = torch.zeros(64)  # a new tensor, same dtype and alignment; n and scale change class-free
    launcher[(5, 2)](*_args(y, out, n=116, scale=0.25), BLOCK=32, num_warps=4)
    assert len(triton_calls) == 1 and launcher.hits == 1
    (call,) = kernels[0].calls
    # grid padded to three axes, the current stream, the kernel's handle and metadata, the
    # launch hooks, then every parameter in order with its default where not passed
    assert call[:5] == (5, 2, 1, 1234, "fn-handle")
    assert call[5] == "meta" and call[6] is None
    assert call[9:] == (y, out, 116, 0.25, True, 32, 3, None)


@pytest.mark.parametrize("change", [
    dict(n=96),  # divisible by 16: Triton specializes it
    dict(n=1),  # 1: a constant to Triton
    dict(n=2**31),  # past int32
    dict(flag=False),
    dict(BLOCK=64),  # a constexpr
    dict(EXTRA=4),  # a defaulted constexpr given
    dict(num_warps=8),  # a launch option
    dict(dtype=torch.float16),
    dict(misaligned=True),  # a pointer no longer 16-byte aligned
])
def test_a_change_triton_would_specialize_on_goes_back_to_triton(toy, change):
    launcher, triton_calls, _ = toy
    base = torch.zeros(80)
    kw = dict(BLOCK=32, num_warps=4)
    launcher[(1,)](*_args(base[:64], base[:64]), **kw)
    x = base[:64].to(change.pop("dtype", torch.float32))
    if change.pop("misaligned", False):
        x = base[1:65]
    args = dict(n=100, scale=0.5, flag=True)
    args.update({k: change.pop(k) for k in list(change) if k in args})
    kw.update(change)
    launcher[(1,)](*_args(x, base[:64], **args), **kw)
    assert len(triton_calls) == 2 and launcher.hits == 0


def test_unkeyable_or_incomplete_arguments_take_tritons_path(toy):
    launcher, triton_calls, _ = toy
    x = torch.zeros(16)
    for _ in range(2):
        launcher[(1,)](x, x, 7, 0.5, [1, 2], BLOCK=16)  # a list: unhashable
    assert len(triton_calls) == 2 and launcher.hits == 0
    launcher[(1,)](x, x, 7, BLOCK=16)  # scale and flag missing: Triton raises its own error
    assert len(triton_calls) == 3 and launcher.hits == 0


def test_switch_off_and_interpreted_functions_take_tritons_path(toy, monkeypatch):
    launcher, triton_calls, _ = toy
    x = torch.zeros(16)
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    for _ in range(3):
        launcher[(1,)](*_args(x, x), BLOCK=16)
    assert len(triton_calls) == 3 and launcher.hits == 0

    seen = []

    class Interpreted:  # what triton.jit returns under TRITON_INTERPRET=1
        def __getitem__(self, grid):
            return lambda *a, **k: seen.append((grid, a, k))

    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    other = launch.FastLauncher(Interpreted())
    other[(2,)](1, B=3)
    other[(2,)](1, B=3)
    assert seen == [((2,), (1,), {**launch.OPTIONS, "B": 3})] * 2 and other.hits == 0


def test_tritons_path_compiles_with_fp_fusion_unless_the_call_says_otherwise(toy):
    """FMA contraction is asked for explicitly (Triton 3.10 turns its default off); a call's
    own option wins, and is part of the key."""
    launcher, triton_calls, _ = toy
    x = torch.zeros(16)
    launcher[(1,)](*_args(x, x), BLOCK=16)
    launcher[(1,)](*_args(x, x), BLOCK=16, enable_fp_fusion=False)
    launcher[(1,)](*_args(x, x), BLOCK=16)  # the first call's kernel, on the fast path
    assert [call[2]["enable_fp_fusion"] for call in triton_calls] == [True, False]
    assert launcher.hits == 1


def test_the_cache_is_bounded(toy, monkeypatch):
    launcher, triton_calls, _ = toy
    monkeypatch.setattr(launch, "MAX_KERNELS", 4)
    x = torch.zeros(16)
    for block in range(6):
        launcher[(1,)](*_args(x, x), BLOCK=block)
    assert len(launcher.kernels) <= 4 and len(triton_calls) == 6


def test_fast_keeps_one_launcher_per_function():
    fn = JITFunction(_toy)
    assert launch.fast(fn) is launch.fast(fn)
    assert launch.fast(fn) is not launch.fast(JITFunction(_toy))


def test_a_launcher_that_refuses_the_call_falls_back_for_good(toy):
    """A compiled launcher called differently (another Triton) raises TypeError before it
    launches: that call and every later one go through Triton's path."""
    launcher, triton_calls, kernels = toy
    x = torch.zeros(16)
    launcher[(1,)](*_args(x, x), BLOCK=16)

    def refuse(*args):
        raise TypeError("launcher signature")

    kernels[0].run = refuse
    launcher[(1,)](*_args(x, x), BLOCK=16)
    assert len(triton_calls) == 2 and launcher.hits == 0
    launcher[(1,)](*_args(x, x), BLOCK=16)
    assert len(triton_calls) == 3 and launcher.hits == 0


def test_every_library_launch_goes_through_fast():
    """No launch site in the library calls a kernel's ``[grid]`` directly (it would pay
    Triton's per-call specialization on every eager call); the benchmarks' floor kernels may."""
    import pathlib
    import re

    import fp8mla

    root = pathlib.Path(fp8mla.__file__).parent
    direct = re.compile(r"(?<![\w.(])(?:\w+\.)?(_\w+_kernel)\[")
    found = []
    for path in root.rglob("*.py"):
        if path.parts[-2] == "bench":  # read-floor kernels, timed as they are
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if direct.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not found, "launches outside fast():\n" + "\n".join(found)


def test_an_error_after_the_launcher_worked_is_raised_not_retried(toy):
    """Once a kernel has launched the fast way, a TypeError from its launcher (an exit hook's,
    after the launch) is raised: retrying through Triton would launch the kernel twice."""
    launcher, triton_calls, kernels = toy
    x = torch.zeros(16)
    for _ in range(2):
        launcher[(1,)](*_args(x, x), BLOCK=16)
    assert launcher.hits == 1

    def fail(*args):
        raise TypeError("from a hook")

    kernels[0].run = fail
    with pytest.raises(TypeError, match="from a hook"):
        launcher[(1,)](*_args(x, x), BLOCK=16)
    assert len(triton_calls) == 1 and launcher.jitted


def test_a_debug_knob_set_after_a_launch_takes_triton_s_path(toy, monkeypatch):
    """Triton compiles a kernel per ``knobs.runtime.debug`` setting: a kernel kept without it
    must not serve a launch made with it (device-side asserts would silently stay off)."""
    from triton import knobs

    launcher, triton_calls, _ = toy
    x = torch.zeros(16)
    launcher[(1,)](*_args(x, x), BLOCK=16)
    monkeypatch.setattr(knobs.runtime, "debug", not knobs.runtime.debug)
    launcher[(1,)](*_args(x, x), BLOCK=16)
    assert len(triton_calls) == 2 and launcher.hits == 0
    launcher[(1,)](*_args(x, x), BLOCK=16)  # the debug kernel, kept under its own key
    assert len(triton_calls) == 2 and launcher.hits == 1


def test_the_key_is_as_fine_as_the_installed_tritons_specialization():
    """Values that share a fast-path key (`launch._arg_key`) get the same specialization from
    this Triton's own (`native_specialize_impl`: type, 16-byte alignment, 1 and divisibility
    by 16) — so a kept kernel never serves a call Triton would have compiled apart. Seen
    alike on triton 3.6, 3.7, 3.8 and 3.9."""
    native = pytest.importorskip("triton._C.libtriton").native_specialize_impl
    from triton.backends.compiler import BaseBackend

    base = torch.empty(64, dtype=torch.uint8)
    values = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 1, 2**31, 2**32, -2**31, -2**31 - 1,
              2**63 - 1, 2**63, 0.5, 1.0, True, False, None,
              *(base[k:k + 16] for k in (0, 1, 8, 16, 32)),
              *(torch.empty(8, dtype=d) for d in (torch.float16, torch.bfloat16, torch.float32,
                                                  torch.int32, torch.uint8))]
    groups = {}
    for v in values:
        spec = native(BaseBackend, v, False, True, True)
        groups.setdefault(launch._arg_key(v), set()).add(str(spec))
    assert all(len(specs) == 1 for specs in groups.values()), groups


def test_launches_on_the_device_of_the_tensors(toy, monkeypatch):
    """Triton launches on the current CUDA device: a call whose tensors are on another device
    makes theirs current for the call — Triton's path and the fast path alike (the kernel kept
    under that device, its stream taken there) — and restores the caller's after."""
    launcher, triton_calls, kernels = toy
    current, seen = [0], []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])

    @contextlib.contextmanager
    def device(index):
        saved, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = saved

    monkeypatch.setattr(torch.cuda, "device", device)
    tensors_on = [1]
    monkeypatch.setattr(launch, "_tensor_device", lambda args: tensors_on[0])
    triton_path = launcher.fn.run
    monkeypatch.setattr(launcher.fn, "run", lambda *a, **k: (seen.append(("triton", current[0])),
                                                             triton_path(*a, **k))[1])
    monkeypatch.setattr(launch, "_raw_stream", lambda d: seen.append(("fast", d, current[0])))
    x = torch.zeros(16)
    launcher[(1,)](*_args(x, x), BLOCK=16)
    launcher[(1,)](*_args(x, x), BLOCK=16)
    assert seen == [("triton", 1), ("fast", 1, 1)] and current[0] == 0
    assert len(triton_calls) == 1 and launcher.hits == 1 and len(kernels[0].calls) == 1
    tensors_on[0] = 0  # the current device's tensors: no switch, and another key
    launcher[(1,)](*_args(x, x), BLOCK=16)
    assert seen[-1] == ("triton", 0) and len(triton_calls) == 2
    tensors_on[0] = launch._NO_TENSOR  # no tensor argument: the current device, no switch
    launcher[(1,)](*_args(1, 2), BLOCK=16)
    assert seen[-1] == ("triton", 0) and len(triton_calls) == 3


def test_cpu_tensors_for_a_compiled_kernel_are_refused_before_triton(toy, monkeypatch):
    """A compiled (not interpreted) kernel over CPU tensors — TRITON_INTERPRET unset, or set
    after triton was imported — raises one error saying what to do, before Triton's path
    (which would fail deep in torch.cuda) and without launching anything."""
    launcher, triton_calls, kernels = toy
    monkeypatch.setattr(launch, "_tensor_device", lambda args: launch._CPU)
    x = torch.zeros(16)
    with pytest.raises(RuntimeError, match="need CUDA tensors.*TRITON_INTERPRET=1 set before "
                                           "triton is first imported.*on cpu"):
        launcher[(1,)](*_args(x, x), BLOCK=16)
    assert triton_calls == [] and kernels == [] and launcher.hits == 0


def test_tensor_device_is_the_first_tensors():
    x = torch.zeros(2)
    assert launch._tensor_device((3, x, None)) == launch._CPU == -1
    assert launch._tensor_device((3, 0.5)) == launch._NO_TENSOR == launch._tensor_device(())
