"""Registers, spills, shared memory and the SASS instruction mix of the decode kernel's main
loop for sm_90, compiled on the CPU (no GPU): the offline half of tuning the kernel.

    python benchmarks/sass_decode.py FMT HEADS_PER_BLOCK BLOCK_N STAGES WORDS_2D NUM_WARPS [FOLD [TMA]] [k=v ...]
    e.g. python benchmarks/sass_decode.py fp8 16 64 3 1 4 1 1
    FOLD (fp8_ds_mla at ≤ 16 rows; default 1): 0 compiles the unfolded scale path
    TMA (default 0): 1 compiles whole tiles by tensor-memory copies (pages of ≥ BLOCK_N)
    sparse=1: the sparse kernel (index lists); lookahead=N, maxnreg=N, lazy=0|1,
    late_sum=0|1: DecodeConfig's;
    sass=PATH: write the whole SASS there

Uses the installed Triton and the cuobjdump / nvdisasm its wheel carries; put another Triton
first on PYTHONPATH to see what that version generates (the H200 runs triton 3.6). On the H200
the fp8 B=64 H=16 kernel measured ≈ 6 cycles per issued instruction per warp at 2 programs per
SM, so loop instructions × 6 / clock ≈ the time of one tile (BENCHMARKS.md).
"""

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import triton

from fp8mla.bench.harness import script_args
from fp8mla.runtime import DecodeConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from portability_compile import NVIDIA_BIN, decode_compile, resource_usage  # noqa: E402


def compile_decode(fmt: str, heads: int, block_n: int, stages: int, words_2d: bool,
                   num_warps: int, fold: bool = True, tma: bool = False, sparse: bool = False,
                   lookahead: int = 1, maxnreg: int | None = None, lazy: bool = False,
                   late_sum: bool = False):
    """The kernel a plan with this configuration launches on sm_90 (s_q 1; `stages` is the
    TMA depth when ``tma``), compiled as the portability test does, with aligned pointers."""
    cfg = DecodeConfig(block_n=block_n, heads_per_block=heads, num_warps=num_warps,
                       num_stages=stages, words_2d=words_2d, fold_scales=fold, tma=tma,
                       tma_stages=stages, lookahead=lookahead, maxnreg=maxnreg,
                       lazy_rescale=lazy, late_sum=late_sum)
    return decode_compile(90, fmt, cfg, 1, sparse, tma, aligned=True)


ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")  # what marks an instruction line of nvdisasm


def kernel_mix(sass: str) -> Counter:
    """Opcode mix of every instruction of a kernel (straight-line kernels: what one call costs)."""
    return Counter(opcode(line) for line in sass.split("\n") if ADDRESS.search(line))


def mix_phrase(ops: Counter, n: int = 12) -> str:
    """The n most frequent opcodes with their counts, as one phrase."""
    return ", ".join(f"{op} {c}" for op, c in ops.most_common(n))


def loops(sass: str, least: int = 100) -> list[tuple[int, Counter]]:
    """Instruction count and opcode mix of every backward branch's body of ≥ ``least``
    instructions, innermost first as they appear (a TMA kernel has its whole-tile loop, then
    the gathered partial tile's, then the span of both)."""
    label_at, pending, instrs = {}, [], []
    for line in sass.split("\n"):
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        addr = ADDRESS.search(line)
        if addr:
            for name in pending:
                label_at[name] = int(addr.group(1), 16)
            pending = []
            instrs.append((int(addr.group(1), 16), line))
    found = []
    for addr, line in instrs:
        target = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if target and label_at.get(target.group(1), addr) < addr:
            lo = label_at[target.group(1)]
            body = [text for a, text in instrs if lo <= a <= addr]
            if len(body) >= least:
                found.append((len(body), Counter(opcode(text) for text in body)))
    return found


def loop_mix(sass: str) -> tuple[int, Counter]:
    """Instruction count and opcode mix of the longest backward branch's body (the tile loop)."""
    return max(loops(sass, 0), key=lambda found: found[0], default=(0, Counter()))


def opcode(line: str) -> str:
    """The opcode of one SASS instruction line (predicate and modifiers dropped)."""
    text = re.sub(r"^@!?U?P\w+\s+", "", re.sub(r"^.*?\*/\s*", "", line).strip())
    return text.split()[0].split(".")[0] if text else "?"


def disassemble(kernel) -> tuple[str, str]:
    """(cuobjdump's resource usage, nvdisasm's SASS) of a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(NVIDIA_BIN, "nvdisasm"), "-c", f.name],
                              capture_output=True, text=True, check=True).stdout
    return resource_usage(kernel), sass


def resources(kernel, usage: str) -> str:
    """Registers, stack, local and shared memory per thread / program, as one phrase."""
    field = lambda name: (re.search(rf"{name}:(\d+)", usage) or [None, "?"])[1]  # noqa: E731
    return (f"registers {field('REG')}, stack {field('STACK')}, local {field('LOCAL')}, "
            f"shared {kernel.metadata.shared} B")


def main() -> None:
    script_args(__doc__, 6, gpu=False)
    opts = dict(a.split("=", 1) for a in sys.argv[7:] if "=" in a)
    fmt, heads, block_n, stages, words_2d, warps = sys.argv[1:7]
    flags = [a for a in sys.argv[7:] if "=" not in a]
    fold = flags[0:1] != ["0"]
    tma = flags[1:2] == ["1"]
    kernel = compile_decode(fmt, int(heads), int(block_n), int(stages), words_2d == "1",
                            int(warps), fold, tma, opts.get("sparse") == "1",
                            int(opts.get("lookahead", 1)),
                            int(opts["maxnreg"]) if "maxnreg" in opts else None,
                            opts.get("lazy") == "1", opts.get("late_sum") == "1")
    usage, sass = disassemble(kernel)
    if "sass" in opts:
        with open(opts["sass"], "w") as f:
            f.write(sass)
    print(f"triton {triton.__version__} sm_90 {fmt} heads/program {heads} block_n {block_n} "
          f"stages {stages} warps {warps}{' tma' if tma else ''}: {resources(kernel, usage)}")
    for n, ops in loops(sass)[:2 if tma else 1]:
        print(f"tile loop: {n} instructions per thread: {mix_phrase(ops)}")


if __name__ == "__main__":
    main()
