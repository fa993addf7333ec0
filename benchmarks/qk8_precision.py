"""How far the FP8 first product (q · Kᵀ as FP8 wgmma, ``QK8``) moves results, on a GPU.

    python benchmarks/qk8_precision.py OUT.json

The ≤ 16-row kernels' QK8 paths (`fp8mla.decode.SM90_MMA16_QK8` for the fp8 wide form,
`SM90_MMA8_DS_QK8` for fp8_ds_mla's, `SPARSE_SM90_MMA8_QK8` for the sparse kernel) split q
exactly into two e4m3 halves, but the wgmma keeps its FP8 sums to ~14 bits, so each 128-dim
chunk's score carries an error relative to that chunk's largest terms. This runs each path with
QK8 off and on over q rows of growing logits — N(0, 1), ×10, ×30, and N(0, 1) with one element
of 300 — and records, per kind, the largest |out − reference| and |lse − reference| over all
rows (the reference: float32 over the same dequantized cache), the largest |logit| and the
largest ratio of a row's |lse| error to its own largest |logit|. Several seeds a kind (each a
fresh cache or pool and q); one JSON row per (path, kind, QK8).
"""

from __future__ import annotations

import os
import sys

import torch

import fp8mla.decode as decode_mod
from fp8mla import reference
from fp8mla.bench.harness import env_info, keep_row, script_args
from fp8mla.bench.sparse import sparse_problem
from fp8mla.decode import DecodePlan
from fp8mla.formats import KV_DIM, LATENT_DIM, dequantize_kv, kv_format
from fp8mla.sparse import SparsePlan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from helpers import paged_cache, request_rows  # noqa: E402

KINDS = ("randn", "x10", "x30", "outlier300")
SEEDS = (1, 2, 3)
SWITCHES = {"SM90_MMA16": True, "SM90_MMA16_DS": True, "SM90_MMA16_MIN_TILES": 0,
            "SM90_MMA16_DS_MIN_TILES": 0, "SM90_MMA16_QK8_MIN_TILES": 0}
QK8_SWITCHES = ("SM90_MMA16_QK8", "SM90_MMA8_DS_QK8", "SPARSE_SM90_MMA8_QK8")


def make_q(kind: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
    """q bf16 of ``shape`` (last dim 576) of one kind."""
    q = torch.randn(*shape, generator=g)
    if kind == "x10":
        q *= 10
    elif kind == "x30":
        q *= 30
    elif kind == "outlier300":
        q[..., 7] = 300
    return q.bfloat16().cuda()


def dense_errors(fmt: str, q: torch.Tensor, seed: int, qk8: bool) -> dict:
    """One dense wide-form run (16 heads) against the reference: max errors, max |logit|."""
    lens = [3000, 2048, 700, 4097]
    cache, table, seqlens = paged_cache(fmt, lens, 64, policy="pow2" if fmt == "fp8_ds_mla"
                                        else None, device="cuda", seed=seed)
    plan = DecodePlan(batch=len(lens), num_heads=q.shape[2], kv_format=cache.fmt, page_size=64,
                      cache_seqlens=seqlens, device="cuda")
    assert plan.kernel == "mma16" and plan.qk8 == qk8, (plan.kernel, plan.qk8)
    out, lse = plan.run(q, cache.layer(0), table, seqlens, fp8_scale=cache.scale(0))
    kv = cache.dequantize(0)
    ro, rl = reference.dense_mla_decode(q, kv, table, seqlens, KV_DIM ** -0.5)
    logit = torch.stack([(q[b, 0].float() @ request_rows(kv, table, b, n, 64).T)
                         .abs().max(-1)[0] for b, n in enumerate(lens)]) * KV_DIM ** -0.5
    return _errors(out, lse, ro, rl, logit[:, None])


def _errors(out, lse, ro, rl, logit):
    """The largest |Δout| and |Δlse|, the largest row |logit| (``logit``: lse's shape) and the
    largest |Δlse| / |logit| of a row."""
    dl = (lse - rl).abs()
    return {"out": float((out.float() - ro.float()).abs().max()), "lse": float(dl.max()),
            "logit": float(logit.max()), "lse_per_logit": float((dl / logit).max())}


def sparse_errors(q: torch.Tensor, seed: int, qk8: bool) -> dict:
    """One sparse run (8 heads, topk 2048, fp8_ds_mla) against the reference."""
    fmt = kv_format("fp8_ds_mla")
    rows, idx, _ = sparse_problem(q.shape[0], q.shape[1], 2048, 1, fmt, "cuda",
                                  pool_tokens=1 << 16, seed=seed)
    plan = SparsePlan(num_queries=q.shape[0], num_heads=q.shape[1], topk=2048, kv_format=fmt,
                      device="cuda")
    assert plan.mma8 and plan.qk8 == qk8
    out, lse = plan.run(q, rows, idx, check=False)
    kv = dequantize_kv(rows[idx.flatten().long()], fmt).view(*idx.shape, KV_DIM)
    s = torch.einsum("thd,tkd->thk", q.float(), kv) * KV_DIM ** -0.5
    ro = torch.softmax(s, -1) @ kv[..., :LATENT_DIM]
    return _errors(out, lse, ro, torch.logsumexp(s, -1), s.abs().amax(-1))


def main() -> int:
    script_args(__doc__)
    out_path = sys.argv[1]
    env = env_info()
    rows = []
    for k, v in SWITCHES.items():
        setattr(decode_mod, k, v)
    for path in ("fp8", "fp8_ds_mla", "sparse"):
        for kind in KINDS:
            for qk8 in (False, True):
                for k in QK8_SWITCHES:
                    setattr(decode_mod, k, qk8)
                worst = {"out": 0.0, "lse": 0.0, "logit": 0.0, "lse_per_logit": 0.0}
                for seed in SEEDS:
                    g = torch.Generator().manual_seed(seed)
                    if path == "sparse":
                        err = sparse_errors(make_q(kind, (4, 8, KV_DIM), g), seed, qk8)
                    else:
                        err = dense_errors(path, make_q(kind, (4, 1, 16, KV_DIM), g), seed, qk8)
                    worst = {k: max(worst[k], err[k]) for k in worst}
                keep_row(out_path, rows, {"path": path, "q": kind, "qk8": qk8, "seeds": len(SEEDS),
                                          **{f"max_{k}": round(v, 5) for k, v in worst.items()}},
                         env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
