"""Registers and the SASS instruction mix of the top-k kernel for sm_90, compiled on the CPU.

    python benchmarks/sass_topk.py BLOCK TAIL NUM_WARPS     e.g. 4096 256 8 (the demo's row)

The passes of a register-resident row (BLOCK + TAIL ≤ 8192) are straight-line code, so the
whole kernel's mix is what one row costs; put another Triton first on PYTHONPATH to see what
that version generates (the H200 runs triton 3.6).
"""

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from sass_decode import BIN  # noqa: E402

from fp8mla.kernels.topk import _topk_kernel  # noqa: E402
from portability_compile import TOPK_SIG, compile_for  # noqa: E402


def main() -> None:
    block, tail, warps = (int(a) for a in sys.argv[1:4])
    kernel = compile_for(_topk_kernel, TOPK_SIG, {
        "BLOCK": block, "ONE_BLOCK": True, "TAIL": tail, "ROWS_PER_REQ": 1, "TO_SLOTS": True},
        90, num_warps=warps)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage",
                                f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name],
                              capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    ops = Counter()
    for line in sass.split("\n"):
        if re.search(r"/\*[0-9a-f]{4,}\*/", line):
            text = re.sub(r"^@!?U?P\w+\s+", "", re.sub(r"^.*?\*/\s*", "", line).strip())
            ops[text.split()[0].split(".")[0] if text else "?"] += 1
    field = lambda name: (re.search(rf"{name}:(\d+)", usage) or [None, "?"])[1]  # noqa: E731
    print(f"triton {triton.__version__} sm_90 top-k block {block} tail {tail} warps {warps}: "
          f"registers {field('REG')}, stack {field('STACK')}, local {field('LOCAL')}, "
          f"shared {kernel.metadata.shared} B")
    print(f"{sum(ops.values())} instructions per thread: "
          + ", ".join(f"{op} {c}" for op, c in ops.most_common(12)))


if __name__ == "__main__":
    main()
