"""What the FlashMLA-compatible entry points cost over the native fp8mla calls (issue #7).

    python benchmarks/compat_overhead.py OUT.json

For each case the same problem runs through the native plan (`DecodePlan.run` /
`SparsePlan.run`) and through `fp8mla.compat.flash_mla`; both are timed eagerly (Python and
launch overhead included, as an engine without graphs sees it) and replayed from a CUDA graph
(how engines run decode). The compat output is compared with the native one first.
"""

from __future__ import annotations

import json
import sys

import torch

from fp8mla.bench.decode import DecodeCase, make_problem
from fp8mla.bench.harness import env_info, graphed, script_args, time_us
from fp8mla.compat import flash_mla
from fp8mla.decode import DecodePlan
from fp8mla.formats import KV_DIM, kv_format, quantize_kv
from fp8mla.sparse import SparsePlan


def dense(case: DecodeCase, fmt_name: str):
    fmt, rows, table, seqlens, q, _ = make_problem(case, fmt_name)
    plan = DecodePlan(batch=case.batch, num_heads=case.heads, kv_format=fmt,
                      page_size=case.page_size, max_seqlen=table.shape[1] * case.page_size,
                      device="cuda")
    native = lambda: plan.run(q, rows, table, seqlens, check=False)
    k_cache = rows.unsqueeze(2) if fmt.is_fp8 else rows.view(torch.bfloat16).unsqueeze(2)
    meta, _ = flash_mla.get_mla_metadata()
    compat = lambda: flash_mla.flash_mla_with_kvcache(
        q, k_cache, table, seqlens, 512, meta, causal=True, is_fp8_kvcache=fmt.is_fp8)
    return f"dense_decode/{fmt_name}/B{case.batch}-ctx{case.context}-H{case.heads}", native, compat


def sparse(batch: int, heads: int, topk: int, pool: int = 1 << 20):
    fmt = kv_format("fp8_ds_mla")
    g = torch.Generator().manual_seed(7)
    rows = torch.empty(pool, fmt.row_bytes, dtype=torch.uint8, device="cuda")
    for i in range(0, pool, 1 << 18):
        n = min(1 << 18, pool - i)
        rows[i:i + n] = quantize_kv(torch.randn(n, 512, generator=g).cuda(),
                                    torch.randn(n, 64, generator=g).cuda(), fmt)
    idx = torch.randint(0, pool, (batch, 1, topk), generator=g, dtype=torch.int32).cuda()
    q = torch.randn(batch, 1, heads, KV_DIM, generator=g).bfloat16().cuda()
    plan = SparsePlan(num_queries=batch, num_heads=heads, topk=topk, kv_format=fmt,
                      device="cuda")
    native = lambda: plan.run(q[:, 0], rows, idx[:, 0], check=False)
    k_cache = rows.view(-1, 64, 1, fmt.row_bytes)
    meta, _ = flash_mla.get_mla_metadata()
    compat = lambda: flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=idx)
    return f"sparse_decode/fp8_ds_mla/B{batch}-H{heads}-topk{topk}-sq1", native, compat


def main() -> int:
    script_args(__doc__)
    env = env_info()
    rows = []
    cases = [dense(DecodeCase(64, 8192, 16), "fp8_ds_mla"), dense(DecodeCase(64, 8192, 16), "bf16"),
             dense(DecodeCase(1, 131072, 8), "fp8_ds_mla"), sparse(64, 8, 2048),
             sparse(128, 128, 2048)]
    for name, native, compat in cases:
        out_n = native()[0].clone()
        out_c = compat()[0]
        if not torch.equal(out_c.view_as(out_n), out_n):  # the same kernel and schedule
            raise AssertionError(f"{name}: compat output differs from the native call")
        row = {"case": name, **env}
        for mode, wrap in (("eager", lambda f: f), ("graph", graphed)):
            tn, tc = time_us(wrap(native)), time_us(wrap(compat))
            row[f"native_{mode}_us"], row[f"compat_{mode}_us"] = round(tn, 2), round(tc, 2)
            row[f"overhead_{mode}_pct"] = round(100 * (tc / tn - 1), 2)
        rows.append(row)
        print(f"{name:<44} graph {row['native_graph_us']:8.1f} -> {row['compat_graph_us']:8.1f} us"
              f" ({row['overhead_graph_pct']:+.1f}%)  eager {row['native_eager_us']:8.1f} -> "
              f"{row['compat_eager_us']:8.1f} us ({row['overhead_eager_pct']:+.1f}%)", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
