"""Experiment (session 12, timed and dropped): 64-row fp8 decode whose q · Kᵀ runs as FP8
wgmma on the raw tile.

Result (H200, h200-20261201-s12-qk8-decode.json): B=64 × 8K × 128 heads 546.4 µs at 4 stages
vs the launcher's 538.8 (267 vs 271 TFLOPS); 64 heads 288.7 vs 282.3. Even at best: the
launcher's 64-row program already converts each tile once (its fp16 copy in shared memory
feeds both wgmma), so this saves only 88 → 80 F2FP and 923 → 807 loop instructions, while
Triton 3.6 keeps q's halves as register operands reloaded per tile (`LDSM` 36) and waits on
each of the ten QGMMA before the next (`warp_group_dot_wait 0`). Reading the halves by
tensor-memory copies does not move them to shared-memory operands: 216 B of spills (offline).

    python benchmarks/qk8_decode.py OUT.json        (GPU, SM90: checks, then times it beside
                                                     the launcher's kernel; JSON rows)
    TRITON_INTERPRET=1 python benchmarks/qk8_decode.py --check   (CPU: against the reference)

Why it was tried: the launcher's 64-row program (H=128 → two programs of 64 heads per request) converts
every 64-token fp8 tile to fp16 twice on its way to the tensor cores — registers, `F2FP`, an
fp16 store to shared memory, then wgmma — for q · Kᵀ (576 dims) and for P · V (512). At B=64 ×
8K × 128 heads that loop issues ~0.9 warp-instructions per cycle per SM with the tensor cores
~28% busy: the chain, not a unit, is the bound (BENCHMARKS.md). Here q is split once, in the
prologue, into two e4m3 halves, q·s = hi + lo (s a power of two per row putting its largest
element at ≤ 256; lo = e4m3(q·s − hi)), so q · Kᵀ = (hi · Kᵀ + lo · Kᵀ) / s is two FP8 wgmma
reading the tile straight from the shared memory its tensor-memory copy filled: no conversion,
no store, on the 576-dim side. Precision: hi + lo keep ~8 significant bits of each q element
(bf16 has 8), so the scores match the float32 reference as closely as the bf16 kernels'.
P · V keeps an fp16 wgmma on the converted tile (FP8 wgmma needs the token dimension contiguous
in shared memory, which V's rows are not).

Scope: fp8 (per-tensor scale) rows only, s_q 1, 64 heads per program, whole 64-token tiles in
pages of ≥ 64 tokens (lengths multiples of 64). The split partials go through the launcher's
combine.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

from fp8mla.decode import DecodePlan
from fp8mla.kernels.common import mma
from fp8mla.kernels.decode import _pool_row

LOG2E = tl.constexpr(1.4426950408889634)
BLOCK_N = 64
HEADS = 64


@triton.jit
def _q_halves(q_row, ok, c: tl.constexpr, WIDTH: tl.constexpr, q_mult):
    """Dims [c, c + WIDTH) of q · q_mult as two e4m3 tensors hi + lo: [HEADS, WIDTH] each."""
    q = tl.load(q_row[:, None] + c + tl.arange(0, WIDTH)[None, :], mask=ok[:, None],
                other=0.0).to(tl.float32) * q_mult[:, None]
    hi = q.to(tl.float8e4nv)
    return hi, (q - hi.to(tl.float32)).to(tl.float8e4nv)


@triton.jit
def _row_absmax(q_row, ok, WIDTH: tl.constexpr, c: tl.constexpr):
    q = tl.load(q_row[:, None] + c + tl.arange(0, WIDTH)[None, :], mask=ok[:, None], other=0.0)
    return tl.max(tl.abs(q.to(tl.float32)), axis=1)


@triton.jit
def _qk8_kernel(q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, fp8_scale_ptr,
                out_ptr, lse_ptr, part_out_ptr, part_lse_ptr, part_max_ptr,
                stride_qb, stride_qh, stride_bt, softmax_scale, num_heads, num_splits,
                page_shift, HEADS: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                DOT_F32: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    head = tl.program_id(2) * HEADS + tl.arange(0, HEADS)
    ok = head < num_heads
    q_row = q_ptr + b.to(tl.int64) * stride_qb + head * stride_qh
    amax = tl.maximum(tl.maximum(_row_absmax(q_row, ok, 256, 0), _row_absmax(q_row, ok, 256, 256)),
                      _row_absmax(q_row, ok, 64, 512))
    # a power of two per row: the largest element lands in [128, 256] (e4m3's top is 448)
    q_mult = tl.where(amax > 0.0, tl.exp2(8.0 - tl.ceil(tl.log2(tl.where(amax > 0.0, amax, 1.0)))),
                      1.0)
    h0, l0 = _q_halves(q_row, ok, 0, 128, q_mult)
    h1, l1 = _q_halves(q_row, ok, 128, 128, q_mult)
    h2, l2 = _q_halves(q_row, ok, 256, 128, q_mult)
    h3, l3 = _q_halves(q_row, ok, 384, 128, q_mult)
    hr, lr = _q_halves(q_row, ok, 512, 64, q_mult)
    kv_mult = tl.load(fp8_scale_ptr)
    qk_scale = softmax_scale * kv_mult * LOG2E / q_mult  # per row

    seqlen = tl.load(seqlens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(seqlen, start + chunk)  # whole tiles only (the script checks lengths)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt

    m_i = tl.full((HEADS,), float("-inf"), tl.float32)
    l_i = tl.zeros((HEADS,), tl.float32)
    a0 = tl.zeros((HEADS, 128), tl.float32)
    a1 = tl.zeros((HEADS, 128), tl.float32)
    a2 = tl.zeros((HEADS, 128), tl.float32)
    a3 = tl.zeros((HEADS, 128), tl.float32)
    row_next = _pool_row(bt_row, start, end, page_shift)
    for n0 in range(start, end, BLOCK_N):
        row0 = row_next
        row_next = _pool_row(bt_row, n0 + BLOCK_N, end, page_shift)
        k0 = lat_desc.load([row0, 0])  # e4m3 [BLOCK_N, 128], dims in order
        k1 = lat_desc.load([row0, 128])
        k2 = lat_desc.load([row0, 256])
        k3 = lat_desc.load([row0, 384])
        kr = rope_desc.load([row0, 512])
        s = mma(h0, tl.trans(k0), tl.zeros((HEADS, BLOCK_N), tl.float32), DOT_F32)
        s = mma(l0, tl.trans(k0), s, DOT_F32)
        s = mma(h1, tl.trans(k1), s, DOT_F32)
        s = mma(l1, tl.trans(k1), s, DOT_F32)
        s = mma(h2, tl.trans(k2), s, DOT_F32)
        s = mma(l2, tl.trans(k2), s, DOT_F32)
        s = mma(h3, tl.trans(k3), s, DOT_F32)
        s = mma(l3, tl.trans(k3), s, DOT_F32)
        s = mma(hr, tl.trans(kr), s, DOT_F32)
        s = mma(lr, tl.trans(kr), s, DOT_F32)
        s = s * qk_scale[:, None]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pm = p.to(tl.float16)
        a0 = mma(pm, k0.to(tl.float16), a0 * alpha[:, None], DOT_F32)
        a1 = mma(pm, k1.to(tl.float16), a1 * alpha[:, None], DOT_F32)
        a2 = mma(pm, k2.to(tl.float16), a2 * alpha[:, None], DOT_F32)
        a3 = mma(pm, k3.to(tl.float16), a3 * alpha[:, None], DOT_F32)
        m_i = m_new
    has = l_i > 0.0
    inv = tl.where(has, kv_mult / tl.where(has, l_i, 1.0), 0.0)
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
    dims = tl.arange(0, 128)[None, :]
    if SPLIT:  # the launcher's workspace: [batch, num_splits, 1, num_heads] rows of 512 fp32
        rows = (b * num_splits + split).to(tl.int64) * num_heads + head
        tl.store(part_lse_ptr + rows, lse, mask=ok)
        tl.store(part_max_ptr + rows, m_i / LOG2E, mask=ok)
        o = part_out_ptr + rows[:, None] * 512 + dims
        tl.store(o + 0, a0 * inv[:, None], mask=ok[:, None])
        tl.store(o + 128, a1 * inv[:, None], mask=ok[:, None])
        tl.store(o + 256, a2 * inv[:, None], mask=ok[:, None])
        tl.store(o + 384, a3 * inv[:, None], mask=ok[:, None])
    else:  # out [batch, 1, num_heads, 512] bf16, lse [batch, 1, num_heads]
        rows = b.to(tl.int64) * num_heads + head
        tl.store(lse_ptr + rows, lse, mask=ok)
        o = out_ptr + rows[:, None] * 512 + dims
        tl.store(o + 0, (a0 * inv[:, None]).to(tl.bfloat16), mask=ok[:, None])
        tl.store(o + 128, (a1 * inv[:, None]).to(tl.bfloat16), mask=ok[:, None])
        tl.store(o + 256, (a2 * inv[:, None]).to(tl.bfloat16), mask=ok[:, None])
        tl.store(o + 384, (a3 * inv[:, None]).to(tl.bfloat16), mask=ok[:, None])


def qk8_run(plan: DecodePlan, q, rows, table, seqlens, scale, num_warps=8, num_stages=2):
    """The experiment's kernel (into ``plan``'s split workspace and the launcher's combine when
    it splits): (out [batch, 1, heads, 512] bf16, lse [batch, 1, heads] float32)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    e4m3 = rows.view(torch.float8_e4m3fn).view(-1, 576)
    lat = TensorDescriptor.from_tensor(e4m3, [BLOCK_N, 128])
    rope = TensorDescriptor.from_tensor(e4m3, [BLOCK_N, 64])
    batch, _, heads, _ = q.shape
    out = torch.empty(batch, 1, heads, 512, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, 1, heads, dtype=torch.float32, device=q.device)
    splits = plan.num_splits
    split = splits > 1
    ws = (plan.part_out, plan.part_lse, plan.part_max) if split else (out, lse, lse)
    _qk8_kernel[(batch, splits, triton.cdiv(heads, HEADS))](
        q, lat, rope, table, seqlens, scale, out, lse, *ws,
        q.stride(0), q.stride(2), table.stride(0), 576 ** -0.5, heads, splits,
        rows.shape[1].bit_length() - 1, HEADS=HEADS, BLOCK_N=BLOCK_N, SPLIT=split,
        DOT_F32=interpreted, num_warps=num_warps, num_stages=num_stages)
    if split:
        plan._combine(out, lse, float("-inf"))
    return out, lse


def _problem(case, device):
    from fp8mla.bench.decode import make_problem

    assert case.context % BLOCK_N == 0 and case.page_size >= BLOCK_N and case.s_q == 1
    return make_problem(case, "fp8", device)


def _plan(case, fmt, seqlens, device, splits):
    return DecodePlan(batch=case.batch, num_heads=case.heads, s_q=1, kv_format=fmt,
                      page_size=case.page_size, cache_seqlens=seqlens, device=device,
                      num_splits=splits)


def check(device: str) -> None:
    """The experiment's kernel against the float32 reference (small sizes on the CPU)."""
    from fp8mla.bench.decode import DecodeCase, _check

    for case, splits in ((DecodeCase(2, 192, 70), 2), (DecodeCase(1, 128, 64, page_size=128), 1)):
        fmt, rows, table, seqlens, q, scale = _problem(case, device)
        plan = _plan(case, fmt, seqlens, device, splits)
        out, lse = qk8_run(plan, q, rows, table, seqlens, scale)
        _check(case, fmt, rows, table, seqlens, q, scale, out, lse)
        print(f"{case} splits {splits}: matches the reference", flush=True)


def time_case(case, warps: int, stages: int) -> dict:
    """Check the kernel on ``case``, then time it and the launcher's plan from CUDA graphs
    (medians; both include the split combine where they split)."""
    from functools import partial

    from fp8mla.bench.decode import _check
    from fp8mla.bench.harness import graphed, time_us

    fmt, rows, table, seqlens, q, scale = _problem(case, "cuda")
    plan = _plan(case, fmt, seqlens, "cuda", None)
    row = {"case": case.name("dense_decode/fp8", "fp8"), "warps": warps, "stages": stages,
           "splits": plan.num_splits}
    try:
        new = partial(qk8_run, plan, q, rows, table, seqlens, scale, warps, stages)
        _check(case, fmt, rows, table, seqlens, q, scale, *new())
        base = partial(plan.run, q, rows, table, seqlens, fp8_scale=scale, check=False)
        for name, fn in (("qk8_us", new), ("launcher_us", base)):
            row[name] = time_us(graphed(fn))
        row["qk8_TFLOPS"] = case.flops() / row["qk8_us"] / 1e6
        row["launcher_TFLOPS"] = case.flops() / row["launcher_us"] / 1e6
    except Exception as e:  # noqa: BLE001 — record and go on
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def main() -> int:
    if "--check" in sys.argv:
        check("cuda" if torch.cuda.is_available() else "cpu")
        return 0
    from fp8mla.bench.decode import DecodeCase
    from fp8mla.bench.harness import announced_ceiling, env_info

    env = env_info()
    ceiling = announced_ceiling(env)
    check("cuda")
    rows = []
    for case in (DecodeCase(64, 8192, 128), DecodeCase(64, 8192, 64)):
        for warps, stages in ((8, 2), (8, 3), (8, 4)):
            rows.append(time_case(case, warps, stages))
            print(rows[-1], flush=True)
            with open(sys.argv[1], "w") as f:  # after every row: a run cut short keeps its rows
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
