"""@triton.jit kernels only; the launchers that validate inputs and pick grids live in fp8mla.ops
and fp8mla.cache. Importing any of them checks the Triton first (`require_triton`)."""

import re

import triton

MIN_TRITON = (3, 6)  # 3.4 cannot compile gdc_wait; 3.5's Gluon has no mma_v2 (README)


def require_triton(version: str) -> None:
    """An ImportError naming what fp8mla needs unless ``version`` (e.g. "3.6.0", "3.10.0+git1")
    is at least `MIN_TRITON` — instead of kernels that fail to compile at the first launch."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or (int(m[1]), int(m[2])) < MIN_TRITON:
        need = ".".join(map(str, MIN_TRITON))
        raise ImportError(f"fp8mla needs triton >= {need} (torch >= 2.10 brings it), found "
                          f"triton {version}")


require_triton(triton.__version__)
