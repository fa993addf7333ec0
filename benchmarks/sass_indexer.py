"""Registers, shared memory and the tile loop's SASS instruction mix of the indexer kernel for
sm_90 as the decode indexer launches it there (whole pages by TMA), compiled on the CPU (no
GPU), for both score orientations (`indexer.KEYS_AS_ROWS`).

    python benchmarks/sass_indexer.py [HEADS ...]        e.g. 32 64 (the default)

Put another Triton first on PYTHONPATH to see what that version generates (the H200 runs 3.6).
"""

import os
import sys

import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from sass_decode import disassemble, loop_mix, resources  # noqa: E402

from portability_compile import indexer_compile  # noqa: E402

SHOWN = ("HMMA", "HGMMA", "F2FP", "LDG", "LDGSTS", "LDSM", "LDS", "STS", "SHFL", "BAR", "IMAD")


def main() -> None:
    for heads in [int(a) for a in sys.argv[1:]] or [32, 64]:
        for keys_as_rows in (False, True):
            kernel = indexer_compile(90, heads, keys_as_rows)
            usage, sass = disassemble(kernel)
            count, mix = loop_mix(sass)
            print(f"triton {triton.__version__} sm_90 indexer heads {heads} "
                  f"{'[keys, heads]' if keys_as_rows else '[heads, keys]'}: "
                  f"{resources(kernel, usage)}; tile loop {count} instructions per thread: "
                  + ", ".join(f"{op} {mix[op]}" for op in SHOWN if mix[op]))


if __name__ == "__main__":
    main()
