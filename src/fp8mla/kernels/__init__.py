"""@triton.jit kernels only; the launchers that validate inputs and pick grids live in fp8mla.ops
and fp8mla.cache. Importing any of them checks the Triton first (`require_triton`)."""

import triton

from fp8mla._versions import NEED_TRITON, triton_accepted


def require_triton(version: str) -> None:
    """An ImportError naming what fp8mla needs unless ``version`` (e.g. "3.6.0", "3.10.0+git1")
    is at least `fp8mla._versions.MIN_TRITON` — instead of kernels that fail to compile at the
    first launch."""
    if not triton_accepted(version):
        raise ImportError(f"fp8mla needs {NEED_TRITON}, found triton {version}")


require_triton(triton.__version__)
