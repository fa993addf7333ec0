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


@pytest.fixture
def device():
    """Where kernel tests run: cuda when present, else the CPU under the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
