"""The Tritons fp8mla accepts, judged from a version string alone (the doctor reads it from
package metadata without importing Triton; `fp8mla.kernels` checks the imported one)."""

from __future__ import annotations

import re

MIN_TRITON = (3, 6)  # 3.4 cannot compile gdc_wait; 3.5's Gluon has no mma_v2 (README)
NEED_TRITON = f"triton >= {MIN_TRITON[0]}.{MIN_TRITON[1]} (torch >= 2.10 brings it)"


def triton_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a Triton version such as "3.6.0" or "3.10.1+git8d2e4b1"; None when it
    does not start with two numbers."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return None if m is None else (int(m[1]), int(m[2]))


def triton_accepted(version: str) -> bool:
    """Whether fp8mla's kernels run on this Triton (at least `MIN_TRITON`)."""
    minor = triton_minor(version)
    return minor is not None and minor >= MIN_TRITON
