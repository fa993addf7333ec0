"""Registers and the SASS instruction mix of the top-k kernel for sm_90, compiled on the CPU.

    python benchmarks/sass_topk.py BLOCK TAIL NUM_WARPS     e.g. 4096 256 8 (the demo's row)

The passes of a register-resident row (BLOCK + TAIL ≤ 8192) are straight-line code, so the
whole kernel's mix is what one row costs; put another Triton first on PYTHONPATH to see what
that version generates (the H200 runs triton 3.6).
"""

import os
import sys

import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from sass_decode import disassemble, kernel_mix, mix_phrase, resources  # noqa: E402

from fp8mla.bench.harness import script_args
from fp8mla.kernels.topk import _topk_kernel  # noqa: E402
from portability_compile import TOPK_SIG, compile_for  # noqa: E402


def main() -> None:
    script_args(__doc__, 3, gpu=False)
    block, tail, warps = (int(a) for a in sys.argv[1:4])
    kernel = compile_for(_topk_kernel, TOPK_SIG, {
        "BLOCK": block, "ONE_BLOCK": True, "TAIL": tail, "ROWS_PER_REQ": 1, "TO_SLOTS": True},
        90, num_warps=warps)
    usage, sass = disassemble(kernel)
    ops = kernel_mix(sass)
    print(f"triton {triton.__version__} sm_90 top-k block {block} tail {tail} warps {warps}: "
          f"{resources(kernel, usage)}")
    print(f"{sum(ops.values())} instructions per thread: {mix_phrase(ops)}")


if __name__ == "__main__":
    main()
