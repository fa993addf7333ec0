"""Dense prefill: groups of tokens on the decode kernel (`fp8mla.prefill.dense_prefill`) against
the path it replaced in session 51 — each query row over the index list of its visible tokens
on the sparse kernel (`SparsePlan`, lists built by `fp8mla.prefill.visible_slots`).

    python benchmarks/prefill_ab.py OUT.json

Each case (`fp8mla.bench.prefill.PrefillCase`) is S new tokens of B requests over contexts of
``ctx`` tokens (S of them new: a fresh prompt where ctx = S, a chunk of a chunked prefill
otherwise), pages of 64, a pool of random rows. `fp8mla bench decode`'s `run_prefill` checks and
times the decode groups; the lists are checked against them, then timed the same way (eagerly
with do_bench: both read the lengths on the host). FLOPs = 2 · heads · Σ visible tokens ·
(576 + 512); bytes are each path's own: rows read once a group (decode) or once a query row
(lists), + q + out; the read ceiling is measured in the same run.
"""

from __future__ import annotations

import functools
from dataclasses import asdict

import torch

from fp8mla.bench.harness import announced_ceiling, env_info, keep_row, script_args, time_us
from fp8mla.bench.prefill import PrefillCase, prefill_problem, run_prefill
from fp8mla.formats import KV_DIM, LATENT_DIM
from fp8mla.prefill import dense_prefill, row_chunks, visible_slots
from fp8mla.sparse import SparsePlan
from fp8mla.testing import assert_close

# (case: batch, new tokens S, context with them, heads; format)
CASES = [(PrefillCase(1, 4096, 4096, 16), "fp8"), (PrefillCase(1, 4096, 4096, 128), "fp8"),
         (PrefillCase(1, 4096, 4096, 16), "fp8_ds_mla"),
         (PrefillCase(1, 1024, 16384, 16), "fp8"), (PrefillCase(4, 2048, 2048, 8), "fp8_ds_mla"),
         (PrefillCase(1, 4096, 4096, 16), "bf16")]


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
    for case, fmt_name in CASES:
        new = run_prefill(case, fmt_name, env, ceiling)[0]  # checked against the reference
        keep_row(path, rows_out, {**asdict(new), "backend": "decode_groups"}, env=env)
        fmt, rows, table, seqlens, q, scale = prefill_problem(case, fmt_name)
        old = functools.partial(lists_prefill, q, rows, table, seqlens, fmt, scale)
        o_old, l_old = old()
        o_new, l_new = dense_prefill(q, rows, table, seqlens, kv_format=fmt, fp8_scale=scale,
                                     check=False)
        assert_close(o_new, o_old, name="out (decode groups against lists)")
        assert_close(l_new, l_old, atol=1e-3, rtol=1e-3, name="lse")
        us = time_us(old)
        moved = case.visible() * fmt.row_bytes + case.io_bytes()
        keep_row(path, rows_out, {
            **asdict(new), "backend": "lists", "us": round(us, 1),
            "TBps": round(moved / us / 1e6, 3), "TFLOPS": round(case.flops() / us / 1e6, 1),
            "note": "index lists on the sparse kernel"}, env=env)

if __name__ == "__main__":
    main()
