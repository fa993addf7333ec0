"""Test set-up: kernels run through Triton's interpreter unless a CUDA GPU is present.

TRITON_INTERPRET must be set before triton is imported, hence at the top of this file.
``gpu``-marked tests run only with CUDA and are skipped otherwise.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the portability compile (tests/portability_compile.py: every kernel for five
    targets, minutes with a cold Triton cache) in the background as soon as its tests are
    collected, so it overlaps the interpreter tests that run before them; with other tests
    selected it takes one worker process and leaves the interpreter the other core."""
    files = {os.path.basename(str(item.fspath)) for item in session.items}
    if "test_portability.py" in files:
        from helpers import start_portability_compile

        session.config.portability_compile = start_portability_compile(
            1 if len(files) > 1 else 2)


def pytest_sessionfinish(session):
    run = getattr(session.config, "portability_compile", None)
    if run is not None and run[0].poll() is None:
        run[0].kill()
        run[0].wait()


@pytest.fixture
def device():
    """Where kernel tests run: cuda when present, else the CPU under the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
