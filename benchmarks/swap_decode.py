"""Experiment prepared in session 11, not yet timed: 16-row fp8 decode with swapped operands.

    python benchmarks/swap_decode.py OUT.json         (GPU, SM90: checks, then times it beside
                                                      the launcher's kernel; JSON rows)
    TRITON_INTERPRET=1 python benchmarks/swap_decode.py --check    (CPU: against the reference)

Why: at 16 rows (8–16 heads, s_q 1) every warp of the launcher's kernel reloads all of q (576
dims, 144 registers it has no room for) from shared memory per 64-token tile — as many bytes
as the tile's fp8 words, and every change that added shared-memory traffic per tile measured
slower on the H200 (BENCHMARKS.md, session 11). Here S^T = K · q^T and O^T = V^T · P^T: both
products are wgmma with M = tokens / latent dims, and q^T is the B operand the hardware reads
from shared memory once per warpgroup. Offline (sm_90, triton 3.6; `BLOCK_N` 128, 8 warps,
TMA 2 stages): 991 instructions per thread per tile, ~3% fewer warp-instructions per token
than the launcher's kernel, 120 B of stack, 96 KB of shared memory, one program per SM;
with 64-token tiles or 4 warps it spills more (224–248 B). Prediction if shared-memory
traffic is the bound: ~15% faster at B=64 × 8K × 16 heads; if not, even.

Scope: fp8 (per-tensor scale) rows only, s_q 1, ≤ 16 heads, whole 128-token tiles inside pages
of ≥ 128 tokens (lengths must be multiples of 128: no partial tile), non-causal within the one
query. The split partials go through the launcher's combine.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

from fp8mla.decode import DecodePlan
from fp8mla.kernels.common import mma, mma4
from fp8mla.kernels.decode import _load_lanes, _pool_row
from fp8mla.kernels.fp8 import SW_DEQUANT_SCALE, e4m3x4_to_f16

LOG2E = tl.constexpr(1.4426950408889634)
BLOCK_N = 128


@triton.jit
def _swap_kernel(q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, fp8_scale_ptr,
                 part_out_ptr, part_lse_ptr, part_max_ptr,
                 stride_qb, stride_qh, stride_bt, softmax_scale, num_heads, num_splits,
                 page_shift, HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
                 HW_FP8: tl.constexpr, SW_SCALE: tl.constexpr, DOT_F32: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    head = tl.arange(0, HEADS)
    ok = head < num_heads
    q_row = q_ptr + b.to(tl.int64) * stride_qb + head * stride_qh
    # q^T per lane j (dims 4c + j of the latent, of the rope's 16 words): [128 | 16, HEADS]
    q0, q1, q2, q3 = _load_lanes(q_row, ok, True, 128)
    r0, r1, r2, r3 = _load_lanes(q_row + 512, ok, True, 16)
    qt0, qt1 = tl.trans(q0.to(tl.float16)), tl.trans(q1.to(tl.float16))
    qt2, qt3 = tl.trans(q2.to(tl.float16)), tl.trans(q3.to(tl.float16))
    rt0, rt1 = tl.trans(r0.to(tl.float16)), tl.trans(r1.to(tl.float16))
    rt2, rt3 = tl.trans(r2.to(tl.float16)), tl.trans(r3.to(tl.float16))
    kv_mult = tl.load(fp8_scale_ptr) * SW_SCALE
    qk_scale = softmax_scale * kv_mult * LOG2E

    seqlen = tl.load(seqlens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(seqlen, start + chunk)  # whole tiles only (the script checks lengths)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt

    m_i = tl.full((HEADS,), float("-inf"), tl.float32)
    l_i = tl.zeros((HEADS,), tl.float32)
    a0 = tl.zeros((128, HEADS), tl.float32)  # O^T per lane: dims 4c + j
    a1 = tl.zeros((128, HEADS), tl.float32)
    a2 = tl.zeros((128, HEADS), tl.float32)
    a3 = tl.zeros((128, HEADS), tl.float32)
    row_next = _pool_row(bt_row, start, end, page_shift)
    for n0 in range(start, end, BLOCK_N):
        row0 = row_next
        row_next = _pool_row(bt_row, n0 + BLOCK_N, end, page_shift)
        k0, k1, k2, k3 = e4m3x4_to_f16(lat_desc.load([row0, 0]), HW_FP8)
        e0, e1, e2, e3 = e4m3x4_to_f16(rope_desc.load([row0, 128]), HW_FP8)
        s = mma4(k0, k1, k2, k3, qt0, qt1, qt2, qt3, tl.zeros((BLOCK_N, HEADS), tl.float32),
                 DOT_F32)  # S^T
        s = mma4(e0, e1, e2, e3, rt0, rt1, rt2, rt3, s, DOT_F32)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp2(s - m_new[None, :])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        pm = p.to(tl.float16)
        a0 = mma(tl.trans(k0), pm, a0 * alpha[None, :], DOT_F32)
        a1 = mma(tl.trans(k1), pm, a1 * alpha[None, :], DOT_F32)
        a2 = mma(tl.trans(k2), pm, a2 * alpha[None, :], DOT_F32)
        a3 = mma(tl.trans(k3), pm, a3 * alpha[None, :], DOT_F32)
        m_i = m_new
    # the launcher's workspace: [batch, num_splits, 1, num_heads] rows of 512 fp32 + lse / max
    has = l_i > 0.0
    inv = tl.where(has, kv_mult / tl.where(has, l_i, 1.0), 0.0)
    rows = (b * num_splits + split).to(tl.int64) * num_heads + head
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / LOG2E, float("-inf"))
    tl.store(part_lse_ptr + rows, lse, mask=ok)
    tl.store(part_max_ptr + rows, m_i / LOG2E, mask=ok)
    o = part_out_ptr + rows[None, :] * 512 + 4 * tl.arange(0, 128)[:, None]
    tl.store(o + 0, a0 * inv[None, :], mask=ok[None, :])
    tl.store(o + 1, a1 * inv[None, :], mask=ok[None, :])
    tl.store(o + 2, a2 * inv[None, :], mask=ok[None, :])
    tl.store(o + 3, a3 * inv[None, :], mask=ok[None, :])


def swap_run(plan: DecodePlan, q, rows, table, seqlens, scale, num_warps=8, num_stages=2):
    """The swapped kernel into ``plan``'s split workspace, then the launcher's combine:
    (out [batch, 1, heads, 512] bf16, lse [batch, 1, heads] float32)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    hw = not interpreted and torch.cuda.get_device_capability() >= (8, 9)
    assert plan.num_splits > 1, "the plan's split workspace is needed (num_splits > 1)"
    u32 = rows.view(torch.int32).view(-1, 144)
    lat = TensorDescriptor.from_tensor(u32, [BLOCK_N, 128])
    rope = TensorDescriptor.from_tensor(u32, [BLOCK_N, 16])
    batch, _, heads, _ = q.shape
    out = torch.empty(batch, 1, heads, 512, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, 1, heads, dtype=torch.float32, device=q.device)
    splits = plan.num_splits
    _swap_kernel[(batch, splits)](
        q, lat, rope, table, seqlens, scale, plan.part_out, plan.part_lse, plan.part_max,
        q.stride(0), q.stride(2), table.stride(0), 576 ** -0.5, heads, splits,
        rows.shape[1].bit_length() - 1, HEADS=16, BLOCK_N=BLOCK_N, HW_FP8=hw,
        SW_SCALE=1.0 if hw else SW_DEQUANT_SCALE, DOT_F32=interpreted, num_warps=num_warps,
        num_stages=num_stages)
    plan._combine(out, lse, float("-inf"))
    return out, lse


def _problem(case, device):
    from fp8mla.bench.decode import make_problem

    assert case.context % BLOCK_N == 0 and case.page_size >= BLOCK_N and case.heads <= 16
    return make_problem(case, "fp8", device)


def _plan(case, fmt, seqlens, device, splits):
    return DecodePlan(batch=case.batch, num_heads=case.heads, s_q=1, kv_format=fmt,
                      page_size=case.page_size, cache_seqlens=seqlens, device=device,
                      num_splits=splits)


def check(device: str) -> None:
    """The swapped kernel against the float32 reference (small sizes on the CPU)."""
    from fp8mla.bench.decode import DecodeCase, _check

    for case, splits in ((DecodeCase(2, 384, 16, page_size=128), 2),
                         (DecodeCase(3, 256, 5, page_size=256), 3)):
        fmt, rows, table, seqlens, q, scale = _problem(case, device)
        plan = _plan(case, fmt, seqlens, device, splits)
        out, lse = swap_run(plan, q, rows, table, seqlens, scale)
        _check(case, fmt, rows, table, seqlens, q, scale, out, lse)
        print(f"{case} splits {splits}: matches the reference", flush=True)


def time_case(case, warps: int, stages: int, own_splits: bool) -> dict:
    """Check the swapped kernel on ``case``, then time it and the launcher's plan (medians;
    both include the split combine). own_splits: the swapped kernel at the split count that
    fills one program per SM (its 255 registers × 256 threads), not the launcher's."""
    from functools import partial

    from fp8mla.bench.decode import _check

    fmt, rows, table, seqlens, q, scale = _problem(case, "cuda")
    plan = _plan(case, fmt, seqlens, "cuda", None)
    swap_plan = plan
    if own_splits:
        swap_plan = _plan(case, fmt, seqlens, "cuda", max(2, plan.target.num_sms // case.batch))
    row = {"case": case.name("dense_decode/fp8", "fp8"), "warps": warps, "stages": stages,
           "launcher_splits": plan.num_splits, "swap_splits": swap_plan.num_splits}
    try:
        swap = partial(swap_run, swap_plan, q, rows, table, seqlens, scale, warps, stages)
        _check(case, fmt, rows, table, seqlens, q, scale, *swap())
        base = partial(plan.run, q, rows, table, seqlens, fp8_scale=scale, check=False)
        for name, fn in (("swap_us", swap), ("launcher_us", base)):
            row[name] = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") * 1e3
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
    for case in (DecodeCase(64, 8192, 16, page_size=128), DecodeCase(1, 131072, 8, page_size=128)):
        for warps, stages, own in ((8, 2, False), (8, 2, True), (8, 3, True)):  # 4 warps: 1.3
            rows.append(time_case(case, warps, stages, own))  # KB of stack (offline)
            print(rows[-1], flush=True)
            with open(sys.argv[1], "w") as f:  # after every row: a run cut short keeps its rows
                json.dump({"env": env, "ceiling_TBps": ceiling, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
