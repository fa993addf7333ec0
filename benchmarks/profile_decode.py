"""Run one decode configuration a few times (for `ncu`): the last launch is the one to profile.

    ncu -k regex:_mla_decode --launch-skip 2 --launch-count 1 \
        python benchmarks/profile_decode.py FMT BATCH CTX HEADS [key=value ...]

key=value pairs override fields of the launcher's DecodeConfig (block_n, num_warps, swap, ...;
none: the launcher's own choice, the Gluon kernels included) and, as splits=N, the split count;
upper-case keys set `fp8mla.decode`'s switches instead (SM90_MMA8=0).
"""

import sys
from dataclasses import fields

from fp8mla.bench.harness import script_args


def parse_overrides(args: list[str], opts: dict) -> dict:
    """key=value arguments: keys of ``opts`` (ints) update it in place; the others are
    DecodeConfig fields, returned as overrides (bools as 1/0/true/false)."""
    from fp8mla.runtime import DecodeConfig

    types = {f.name: f.type for f in fields(DecodeConfig)}
    over = {}
    for kv in args:
        k, v = kv.split("=")
        if k in opts:
            opts[k] = int(v)
        else:
            over[k] = v in ("1", "True", "true") if types[k] in (bool, "bool") else int(v)
    return over


def main() -> None:
    script_args(__doc__, 4)
    from dataclasses import replace

    import fp8mla.decode as decode_mod
    from fp8mla.bench.decode import DecodeCase, make_problem
    from fp8mla.decode import DecodePlan
    from fp8mla.runtime import decode_config

    fmt_name, batch, ctx, heads = sys.argv[1], *map(int, sys.argv[2:5])
    opts = {"splits": None}
    switches = [kv.split("=") for kv in sys.argv[5:] if kv[0].isupper()]
    for k, v in switches:
        setattr(decode_mod, k, type(getattr(decode_mod, k))(int(v)))
    over = parse_overrides([kv for kv in sys.argv[5:] if not kv[0].isupper()], opts)
    case = DecodeCase(batch, ctx, heads)
    fmt, rows, table, seqlens, q, scale = make_problem(case, fmt_name)
    cfg = replace(decode_config(90, fmt_name, heads, 1), **over)
    plan = DecodePlan(batch=batch, num_heads=heads, kv_format=fmt, page_size=case.page_size,
                      cache_seqlens=seqlens, device="cuda", config=cfg if over else None,
                      num_splits=opts["splits"])
    for _ in range(3):
        plan.run(q, rows, table, seqlens, fp8_scale=scale, check=False)
    print("profiled", fmt_name, batch, ctx, heads, cfg, "splits", plan.num_splits, "kernel",
          plan.kernel, dict(switches))


if __name__ == "__main__":
    main()
