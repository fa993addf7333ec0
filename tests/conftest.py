"""Test set-up: kernels run through Triton's interpreter unless a CUDA GPU is present.

TRITON_INTERPRET must be set before triton is imported, hence at the top of this file.
``gpu``-marked tests run only with CUDA and are skipped otherwise.
"""

import faulthandler
import os
import shutil
import subprocess
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()
_STDERR = []  # a copy of the terminal's stderr, taken before output capture (`_gpu_watchdog`)


def pytest_configure(config):
    _STDERR.append(os.dup(2))
    if not hasattr(config, "workerinput"):  # the run's first process (xdist's controller or
        # the only one): a folder for the portability compile's result, which the workers
        # (started after this, with this environment) find through the variable
        from helpers import PORTABILITY_DIR

        config.portability_dir = tempfile.mkdtemp(prefix="fp8mla-portability-")
        os.environ[PORTABILITY_DIR] = config.portability_dir


def pytest_unconfigure(config):
    folder = getattr(config, "portability_dir", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the portability compile (tests/portability_compile.py: every kernel for six
    targets, minutes with a cold Triton cache) in the background as soon as its tests are
    collected, so it overlaps the interpreter tests that run before them, in two processes.
    One compile a run: under xdist the first worker starts it and every worker reads its
    result (each worker ran its own before: with a cold Triton cache the whole suite took 739 s
    on two cores, 515 s now)."""
    needed = any("compiled" in getattr(item, "fixturenames", ()) for item in session.items
                 if os.path.basename(str(item.fspath)) == "test_portability.py")
    if needed and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        from helpers import portability_result, start_portability_compile

        session.config.portability_compile = start_portability_compile(2, portability_result())


def pytest_sessionfinish(session, exitstatus):
    """Under xdist the compile outlives its worker's tests while another worker may still wait
    for it; alone, or interrupted, the run ends it."""
    proc = getattr(session.config, "portability_compile", None)
    if proc is None or proc.poll() is not None:
        return
    from helpers import COMPILE_TIMEOUT_S, stop_portability_compile

    if exitstatus != pytest.ExitCode.INTERRUPTED and "PYTEST_XDIST_WORKER" in os.environ:
        try:
            proc.wait(timeout=COMPILE_TIMEOUT_S)
            return
        except subprocess.TimeoutExpired:
            pass
    stop_portability_compile(proc)


@pytest.fixture(autouse=True)
def _gpu_watchdog(request):
    """A ``gpu`` test still running after FP8MLA_GPU_TEST_TIMEOUT seconds (default 300; 0:
    no limit) — a kernel that hangs — dumps every thread's stack and ends its process, the
    GPU context and the hung kernel with it: a hang then costs a GPU session that long and
    names its test, instead of silently spending the whole device call (session 29's first
    two-group kernel did)."""
    limit = float(os.environ.get("FP8MLA_GPU_TEST_TIMEOUT", "300"))
    if not (HAS_CUDA and limit > 0 and "gpu" in request.keywords):
        yield
        return
    faulthandler.dump_traceback_later(limit, exit=True, file=_STDERR[0] if _STDERR else 2)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def device():
    """Where kernel tests run: cuda when present, else the CPU under the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
