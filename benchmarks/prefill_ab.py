"""Dense prefill: groups of tokens on the decode kernel (`fp8mla.prefill.dense_prefill`) against
the path it replaced in session 51 — each query row over the index list of its visible tokens
on the sparse kernel (`SparsePlan`, lists built by `fp8mla.prefill.visible_slots`).

    python benchmarks/prefill_ab.py OUT.json

Each case is S new tokens of B requests over contexts of ``ctx`` tokens (S of them new: a fresh
prompt where ctx = S, a chunk of a chunked prefill otherwise), pages of 64, a pool of random
rows. Both paths are checked against each other, and the last four queries of request 0
against the float32 reference, then timed eagerly with do_bench (both read the lengths on the
host). FLOPs = 2 · heads · Σ visible tokens · (576 + 512); bytes are each path's own: rows read
once a group (decode) or once a query row (lists), + q + out; the read ceiling is measured in
the same run.
"""

from __future__ import annotations

import functools

import torch

from fp8mla import reference
from fp8mla.bench.decode import DecodeCase, make_problem
from fp8mla.bench.harness import announced_ceiling, env_info, keep_row, script_args, time_us
from fp8mla.formats import KV_DIM, LATENT_DIM, dequantize_kv
from fp8mla.prefill import GROUP, dense_prefill, query_groups, row_chunks, visible_slots
from fp8mla.sparse import SparsePlan
from fp8mla.testing import assert_close

# (batch, new tokens S, context with them, heads, format)
CASES = [(1, 4096, 4096, 16, "fp8"), (1, 4096, 4096, 128, "fp8"),
         (1, 4096, 4096, 16, "fp8_ds_mla"), (1, 1024, 16384, 16, "fp8"),
         (4, 2048, 2048, 8, "fp8_ds_mla"), (1, 4096, 4096, 16, "bf16")]


def lists_prefill(q, rows, table, seqlens, fmt, scale):
    """Session 50's dense prefill: every query row over the list of the slots it sees."""
    b, s, h, _ = q.shape
    out = torch.empty(b * s, h, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(b * s, h, dtype=torch.float32, device=q.device)
    width = int(seqlens.max())
    r = torch.arange(b * s, device=q.device)
    request = r // s
    visible = (seqlens.long()[request] - s + 1 + r % s).clamp(0, width)
    plans = {}
    for r0, r1 in row_chunks(b * s, width, heads=h):
        idx = visible_slots(table, request[r0:r1], visible[r0:r1], width, rows.shape[1])
        plan = plans.get(r1 - r0)
        if plan is None:
            plan = plans[r1 - r0] = SparsePlan(num_queries=r1 - r0, num_heads=h, topk=width,
                                               kv_format=fmt, device=q.device,
                                               own_outputs=False)
        plan.run(q.view(b * s, h, KV_DIM)[r0:r1], rows, idx, visible[r0:r1].to(torch.int32),
                 fp8_scale=scale, check=False, out=out[r0:r1], lse=lse[r0:r1])
    return out.view(b, s, h, LATENT_DIM), lse.view(b, s, h)


def main() -> None:
    path = script_args(__doc__)[1]
    env = env_info()
    ceiling = announced_ceiling(env)
    rows_out: list[dict] = []
    for batch, s, ctx, heads, fmt_name in CASES:
        fmt, rows, table, seqlens, q_all, scale = make_problem(
            DecodeCase(batch, ctx, heads, s_q=1), fmt_name)
        g = torch.Generator(device="cpu").manual_seed(s + heads)
        q = (torch.randn(batch, s, heads, KV_DIM, generator=g) * 0.5).to(torch.bfloat16).cuda()
        new = functools.partial(dense_prefill, q, rows, table, seqlens, kv_format=fmt,
                                fp8_scale=scale, check=False)
        old = functools.partial(lists_prefill, q, rows, table, seqlens, fmt, scale)
        (o_new, l_new), (o_old, l_old) = new(), old()
        assert_close(o_new, o_old, name="out (decode groups against lists)")
        assert_close(l_new, l_old, atol=1e-3, rtol=1e-3, name="lse")
        kv = dequantize_kv(rows, fmt, scale)
        ro, rl = reference.dense_mla_decode(q[:1, -4:], kv, table[:1], seqlens[:1],
                                            KV_DIM ** -0.5)
        assert_close(o_new[:1, -4:], ro, name="out (last four queries against the reference)")
        visible = sum(max(0, ctx - s + 1 + i) for i in range(s)) * batch
        group = min(s, GROUP)
        grouped = int(query_groups(seqlens, s, group).long().sum())
        io = batch * s * heads * (KV_DIM + LATENT_DIM) * 2
        flops = 2 * heads * visible * (KV_DIM + LATENT_DIM)
        case = f"dense_prefill/{fmt_name}/B{batch}-S{s}-ctx{ctx}-H{heads}"
        for name, fn, kv_rows in (("decode_groups", new, grouped), ("lists", old, visible)):
            us = time_us(fn)
            moved = kv_rows * fmt.row_bytes + io
            keep_row(path, rows_out, {
                "case": case, "backend": name, "us": round(us, 1),
                "TBps": round(moved / us / 1e6, 3), "TFLOPS": round(flops / us / 1e6, 1),
                "ceiling_TBps": round(ceiling, 3), **env}, env=env)


if __name__ == "__main__":
    main()
