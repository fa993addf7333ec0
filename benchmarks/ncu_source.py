"""Where a kernel's warps stall, by region and opcode, from Nsight Compute's source counters.

    ncu -k regex:_mla_decode --launch-skip 2 --launch-count 1 --section SourceCounters \
        --section WarpStateStats --import-source no --page source --print-source sass --csv \
        python3 benchmarks/profile_sparse.py 64 64 > OUT.csv      # (or profile_decode.py ...)
    python benchmarks/ncu_source.py OUT.csv[.gz]

Instructions are grouped by how often they executed (a tile loop's body shares one count; the
prologue and epilogue another), and each group's share of the warp-stall samples is printed
with its main stall reasons and the opcodes that collected the samples (session 8: this is how
the 2-byte q / out moves of 64-row programs were found).
"""

import csv
import gzip
import sys
from collections import defaultdict

from fp8mla.bench.harness import script_args


def read(path: str) -> tuple[list[str], list[list[str]]]:
    """(header, one row per SASS instruction) of the CSV's first kernel."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[start]
    return header, [r for r in rows[start + 1:] if len(r) == len(header)]


def opcode(source: str) -> str:
    words = source.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main() -> None:
    script_args(__doc__, 1, gpu=False)
    header, rows = read(sys.argv[1])
    col = {name: header.index(name) for name in header}
    samples = col["Warp Stall Sampling (All Samples)"]
    executed = col["Instructions Executed"]
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, c: float(r[c] or 0)  # noqa: E731
    total = sum(num(r, samples) for r in rows) or 1.0
    groups = defaultdict(list)
    for r in rows:
        groups[num(r, executed)].append(r)
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    for count, members in sorted(groups.items(), key=lambda g: -sum(num(r, samples)
                                                                    for r in g[1]))[:4]:
        share = sum(num(r, samples) for r in members) / total
        if share < 0.01:
            break
        why = sorted(((sum(num(r, col[c]) for r in members) / total, c[6:]) for c in reasons),
                     reverse=True)[:6]
        ops = defaultdict(float)
        for r in members:
            ops[opcode(r[col["Source"]])] += num(r, samples) / total
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:10]
        print(f"\n{len(members)} instructions executed {count:.0f}× each: {share:.0%} of samples")
        print("  stalls:  " + ", ".join(f"{name} {s:.0%}" for s, name in why))
        print("  opcodes: " + ", ".join(f"{op} {s:.0%}" for op, s in top))


if __name__ == "__main__":
    main()
