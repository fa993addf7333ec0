"""Side by side: the same cases' medians from several result files of `fp8mla bench` (e.g. one
GPU under different Triton releases), µs per (case, backend), the last column's ratio to the
first. Prints a Markdown table; rows whose ratio is outside [1 - tol, 1 + tol] are starred.

    python benchmarks/compare_results.py A.json B.json [C.json ...] [--backends fp8mla_graph,...]
"""

import argparse
import json


def load(path: str) -> tuple[str, dict[tuple[str, str], float], float]:
    """(label, {(case, backend): µs}, read ceiling TB/s) of one result file."""
    rows = json.load(open(path))
    first = rows[0]
    label = f"{first['gpu'].replace('NVIDIA ', '')} triton {first['triton']}"
    return label, {(r["case"], r["backend"]): r["us"] for r in rows}, first["ceiling_TBps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--backends", default="fp8mla_graph,fp8mla_graph_cleanL2",
                    help="comma-separated backends to show (default: the graph rows)")
    ap.add_argument("--tol", type=float, default=0.03, help="ratio band left unstarred")
    args = ap.parse_args()
    runs = [load(f) for f in args.files]
    keep = set(args.backends.split(","))
    print("| case | backend | " + " | ".join(label for label, _, _ in runs) + " | ratio |")
    print("|---|---|" + "---|" * len(runs) + "---|")
    print("| read ceiling, TB/s | | " + " | ".join(f"{c:.2f}" for _, _, c in runs) + " | |")
    for key in runs[0][1]:
        if key[1] not in keep or not all(key in rows for _, rows, _ in runs):
            continue
        us = [rows[key] for _, rows, _ in runs]
        ratio = us[-1] / us[0]
        star = " *" if abs(ratio - 1) > args.tol else ""
        print(f"| {key[0]} | {key[1]} | " + " | ".join(f"{u:.1f}" for u in us)
              + f" | {ratio:.2f}{star} |")


if __name__ == "__main__":
    main()
