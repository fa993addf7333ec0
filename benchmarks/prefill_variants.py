"""Where dense prefill's time goes (`fp8mla.prefill.dense_prefill`: groups of new tokens as
decode requests), case by case: the whole call, then a decode plan's run alone, replayed from a
CUDA graph, for groups of 1, 2 and 4 tokens (the plan's s_q), in token order (shortest first,
as the call launches them) and longest first; the call, and each group size whose plans it
changes, again with every query's heads in one 64-row program (`fp8mla.decode.SM90_PACKED`).

    python benchmarks/prefill_variants.py OUT.json

Cases as `benchmarks/prefill_ab.py`'s below 64 heads; do_bench medians; FLOPs = 2 · heads · Σ visible tokens
· (576 + 512).
"""

from __future__ import annotations

import functools

import torch

import fp8mla.decode as decode_mod
from fp8mla.bench.harness import (
    announced_ceiling,
    env_info,
    graphed,
    keep_row,
    kernel_note,
    script_args,
    time_us,
)
from fp8mla.bench.prefill import PrefillCase, prefill_problem
from fp8mla.decode import DecodePlan
from fp8mla.formats import KV_DIM
from fp8mla.prefill import dense_prefill, query_groups

# `benchmarks/prefill_ab.py`'s below 64 heads (at 128 every group size takes the 64-row Gluon
# kernels a program a query), and 32 heads (groups of 4: 128 rows; of 2: 64; of 1: 32)
CASES = [(PrefillCase(1, 4096, 4096, 16), "fp8"), (PrefillCase(4, 2048, 2048, 8), "fp8_ds_mla"),
         (PrefillCase(1, 1024, 16384, 16), "fp8"), (PrefillCase(1, 4096, 4096, 32), "fp8")]


def main() -> None:
    path = script_args(__doc__)[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    rows_out: list[dict] = []
    for pc, fmt_name in CASES:
        fmt, rows, table, seqlens, q, scale = prefill_problem(pc, fmt_name)
        batch, s, heads = pc.batch, pc.new, pc.heads
        case, flops = pc.name(fmt_name), pc.flops()

        def row(name, fn, note=None, case=case, flops=flops):
            us = time_us(fn)
            keep_row(path, rows_out, {"case": case, "variant": name, "us": round(us, 1),
                                      "TFLOPS": round(flops / us / 1e6, 1), "note": note,
                                      "ceiling_TBps": round(ceiling, 3), **env}, env=env)

        call = functools.partial(dense_prefill, q, rows, table, seqlens, kv_format=fmt,
                                 fp8_scale=scale, check=False)
        row("call", call)
        # every query's heads in one 64-row Gluon program (`fp8mla.decode.SM90_PACKED`, off
        # by default; the call's plans are built per call, so the switch stays on for it)
        decode_mod.SM90_PACKED = True
        try:
            row("call-packed", call)
        finally:
            decode_mod.SM90_PACKED = False
        for group in (1, 2, 4):  # s a multiple of each: no padding
            n = batch * (s // group)
            lens = query_groups(seqlens, s, group)
            owner = torch.arange(batch, device="cuda").repeat_interleave(s // group)
            q_v, bt_v = q.view(n, group, heads, KV_DIM), table[owner]
            rev = torch.arange(n - 1, -1, -1, device="cuda")
            for packed in (False, True):  # (a plan keeps the switch it was made with)
                decode_mod.SM90_PACKED = packed
                try:
                    plan = DecodePlan(batch=n, num_heads=heads, kv_format=fmt, page_size=64,
                                      max_seqlen=pc.context, s_q=group, device="cuda")
                finally:
                    decode_mod.SM90_PACKED = False
                if packed and not plan.packed:
                    continue  # 33–64 rows only: the same plan as unpacked
                for order, args in (("token_order", (q_v, bt_v, lens)),
                                    ("longest_first", (q_v[rev].contiguous(),
                                                       bt_v[rev].contiguous(),
                                                       lens[rev].contiguous()))):
                    fn = functools.partial(plan.run, args[0], rows, *args[1:],
                                           fp8_scale=scale, check=False)
                    row(f"graph-sq{group}-{order}{'-packed' * packed}", graphed(fn),
                        kernel_note(plan))

if __name__ == "__main__":
    main()
