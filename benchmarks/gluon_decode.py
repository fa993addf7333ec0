"""Experiment (session 13): the 64-row fp8 decode loop written in Gluon, so q · Kᵀ is split across
the two warpgroups instead of computed by both.

    python benchmarks/gluon_decode.py OUT.json          (GPU, SM90, triton with Gluon: checks it
                                                         against DecodePlan, then times both)
    python benchmarks/gluon_decode.py --sass [FILE]     (CPU: compile for sm_90, SASS summary)

Why: Triton lays out a dot whose result feeds another dot with every warp along M, so the
launcher's 64-row program (8 warps) computes the 64 × 64 score tile in both warpgroups — 72 of
its 88 HGMMA per tile (BENCHMARKS.md, session 13). Gluon takes the layouts from the kernel: here
S is [4, 2] warps (each warpgroup its 32 token columns), O [4, 2] (each 256 of the 512 dims), q
and the fp16 tile are shared-memory operands. Offline (sm_90, triton 3.6): 40 HGMMA and ~540
instructions per thread per tile against 88 and 923, 255 registers, no spills.

Scope: fp8 (per-tensor scale) rows, s_q 1, 64 heads per program, one split, whole 64-token
tiles in pages of 64 (lengths multiples of 64). Tiles arrive by TMA into a two-stage ring;
each is converted once to fp16 in shared memory for both products.
"""

from __future__ import annotations

import functools
import json
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
)

LOG2E = gl.constexpr(1.4426950408889634)
HEADS = 64
BN = 64
STAGES = 2


@gluon.jit
def _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, stage, row0, BN: gl.constexpr):
    bar = bars.index(stage)
    mbarrier.expect(bar, BN * 576)
    for c in gl.static_range(4):
        tma.async_copy_global_to_shared(lat_desc, [row0, c * 128], bar, lat_buf.index(stage * 4 + c))
    tma.async_copy_global_to_shared(rope_desc, [row0, 512], bar, rope_buf.index(stage))


@gluon.jit
def _gluon_decode_kernel(q_ptr, lat_desc, rope_desc, bt_ptr, seqlens_ptr, out_ptr, lse_ptr,
                         stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_lb,
                         qk_scale, kv_mult, num_heads, HEADS: gl.constexpr,
                         BN: gl.constexpr):
    b = gl.program_id(0)
    hb = gl.program_id(1)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, 32, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, 256, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    sh16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                              rank=2)

    h = hb * HEADS + gl.arange(0, HEADS, layout=gl.SliceLayout(1, ld))
    ok = h < num_heads
    c128 = gl.arange(0, 128, layout=gl.SliceLayout(0, ld))
    c64 = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    q_row = q_ptr + b.to(gl.int64) * stride_qb + h * stride_qh
    q_lat_s = gl.allocate_shared_memory(gl.float16, [HEADS, 512], sh16)
    for c in gl.static_range(4):
        x = gl.load(q_row[:, None] + c * 128 + c128[None, :], mask=ok[:, None], other=0.0)
        q_lat_s.slice(c * 128, 128, dim=1).store(x.to(gl.float16))
    q_rope = gl.load(q_row[:, None] + 512 + c64[None, :], mask=ok[:, None], other=0.0)
    q_rope_s = gl.allocate_shared_memory(gl.float16, [HEADS, 64], sh16, q_rope.to(gl.float16))
    k_lat_s = gl.allocate_shared_memory(gl.float16, [BN, 512], sh16)
    k_rope_s = gl.allocate_shared_memory(gl.float16, [BN, 64], sh16)
    lat_buf = gl.allocate_shared_memory(gl.uint8, [2 * 4, BN, 128], lat_desc.layout)
    rope_buf = gl.allocate_shared_memory(gl.uint8, [2, BN, 64], rope_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(bars.index(j), count=1)

    n_tiles = gl.load(seqlens_ptr + b) // BN
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, 0, gl.load(bt_row) * BN, BN)
    m_i = gl.full([HEADS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
    l_i = gl.full([HEADS], 0.0, gl.float32, layout=gl.SliceLayout(1, s_l))
    acc = gl.zeros([HEADS, 512], gl.float32, layout=o_l)
    for i in range(n_tiles):
        stage = i % 2
        gl.thread_barrier()  # both warpgroups are done with the last tile's buffers
        fence_async_shared()  # ... before the next copy writes over them
        if i + 1 < n_tiles:
            _issue(lat_desc, rope_desc, lat_buf, rope_buf, bars, 1 - stage,
                   gl.load(bt_row + i + 1) * BN, BN)
        mbarrier.wait(bars.index(stage), (i // 2) & 1)
        for c in gl.static_range(4):
            w = lat_buf.index(stage * 4 + c).load(ld)
            k_lat_s.slice(c * 128, 128, dim=1).store(
                w.to(gl.float8e4nv, bitcast=True).to(gl.float16))
        r = rope_buf.index(stage).load(ld)
        k_rope_s.store(r.to(gl.float8e4nv, bitcast=True).to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        s = gl.zeros([HEADS, BN], gl.float32, layout=s_l)
        s = warpgroup_mma(q_lat_s, k_lat_s.permute((1, 0)), s)
        s = warpgroup_mma(q_rope_s, k_rope_s.permute((1, 0)), s)
        s = s * qk_scale
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        p = gl.exp2(s - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        pm = gl.convert_layout(p.to(gl.float16), p_l)
        a = gl.convert_layout(alpha, gl.SliceLayout(1, o_l))
        acc = warpgroup_mma(pm, k_lat_s, acc * a[:, None])
    for j in gl.static_range(2):
        mbarrier.invalidate(bars.index(j))
    inv = gl.convert_layout(kv_mult / l_i, gl.SliceLayout(1, o_l))
    ho = hb * HEADS + gl.arange(0, HEADS, layout=gl.SliceLayout(1, o_l))
    co = gl.arange(0, 512, layout=gl.SliceLayout(0, o_l))
    o_row = out_ptr + b.to(gl.int64) * stride_ob + ho * stride_oh
    gl.store(o_row[:, None] + co[None, :], (acc * inv[:, None]).to(gl.bfloat16),
             mask=(ho < num_heads)[:, None])
    hl = hb * HEADS + gl.arange(0, HEADS, layout=gl.SliceLayout(1, s_l))
    gl.store(lse_ptr + b.to(gl.int64) * stride_lb + hl, (m_i + gl.log2(l_i)) / LOG2E,
             mask=hl < num_heads)


def descriptors(rows: torch.Tensor):
    """TMA descriptors over uint8 pool rows [num_slots, 576]: four [BN, 128] latent boxes and
    one [BN, 64] rope box per tile."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    lay128 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    lay64 = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    return (TensorDescriptor.from_tensor(rows, [BN, 128], lay128),
            TensorDescriptor.from_tensor(rows, [BN, 64], lay64))


def gluon_decode(q, rows, table, seqlens, out, lse, softmax_scale, kv_mult):
    """q [batch, 1, heads, 576] bf16; rows uint8 [num_slots, 576] (the fp8 format, scale
    kv_mult: a float); table int32 [batch, pages] (pages of 64); out bf16 [batch, 1, heads,
    512]; lse float32 [batch, 1, heads]."""
    batch, _, heads, _ = q.shape
    lat, rope = descriptors(rows)
    _gluon_decode_kernel[(batch, triton.cdiv(heads, HEADS))](
        q, lat, rope, table, seqlens, out, lse, q.stride(0), q.stride(2), table.stride(0),
        out.stride(0), out.stride(2), lse.stride(0), softmax_scale * kv_mult * 1.4426950408889634,
        kv_mult, heads,
        HEADS=HEADS, BN=BN, num_warps=8)
    return out, lse


def sass(path=None) -> None:
    """Compile for sm_90 on the CPU and print resources and the tile loop's instruction mix."""
    import os

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sys.path.insert(0, os.path.dirname(__file__))
    from sass_decode import disassemble, loops, mix_phrase, resources

    lay128 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    lay64 = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    sig = {"q_ptr": "*bf16", "lat_desc": f"tensordesc<u8[{BN}, 128],{lay128!r}>",
           "rope_desc": f"tensordesc<u8[{BN}, 64],{lay64!r}>", "bt_ptr": "*i32",
           "seqlens_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "stride_qb": "i32",
           "stride_qh": "i32", "stride_bt": "i32", "stride_ob": "i32", "stride_oh": "i32",
           "stride_lb": "i32", "qk_scale": "fp32", "kv_mult": "fp32", "num_heads": "i32",
           "HEADS": "constexpr",
           "BN": "constexpr"}
    names = _gluon_decode_kernel.arg_names
    src = GluonASTSource(_gluon_decode_kernel, sig, constexprs={
        (names.index("HEADS"),): HEADS, (names.index("BN"),): BN})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    usage, text = disassemble(k)
    if path:
        with open(path, "w") as f:
            f.write(text)
    print(f"triton {triton.__version__} gluon decode sm_90: {resources(k, usage)}")
    for n, ops in loops(text)[:1]:
        print(f"tile loop: {n} instructions per thread: {mix_phrase(ops)}")


def main() -> int:
    if sys.argv[1] == "--sass":
        sass(sys.argv[2] if len(sys.argv) > 2 else None)
        return 0
    from fp8mla import reference
    from fp8mla.bench.decode import DecodeCase, make_problem
    from fp8mla.bench.harness import announced_ceiling, env_info, graphed, time_us
    from fp8mla.decode import DecodePlan
    from fp8mla.formats import dequantize_kv
    from fp8mla.testing import assert_close

    env = env_info()
    ceiling = announced_ceiling(env)
    rows_out = []
    for case in (DecodeCase(64, 8192, 128), DecodeCase(128, 2048, 128)):
        fmt, kv, table, seqlens, q, scale = make_problem(case, "fp8")
        flat = kv.view(-1, 576)
        plan = DecodePlan(batch=case.batch, num_heads=case.heads, kv_format=fmt,
                          page_size=case.page_size, cache_seqlens=seqlens, device="cuda")
        ref_fn = functools.partial(plan.run, q, kv, table, seqlens, fp8_scale=scale, check=False)
        lo, ll = [t.clone() for t in ref_fn()]
        out = torch.full_like(lo, float("nan"))
        lse = torch.full_like(ll, float("nan"))
        fn = functools.partial(gluon_decode, q, flat, table, seqlens, out, lse, 576 ** -0.5,
                               float(scale))
        fn()
        rows = (dequantize_kv(flat, fmt) * float(scale)).view(*kv.shape[:2], 576)
        ro, rl = reference.dense_mla_decode(q, rows, table, seqlens, 576 ** -0.5)
        del rows
        for name, o, lg in (("launcher", lo, ll), ("gluon", out, lse)):
            err = ((o.float() - ro).norm() / ro.norm()).item()
            print(f"{name}: |out - ref| / |ref| = {err:.2e}, max |lse - ref| = "
                  f"{(lg - rl).abs().max().item():.2e}", flush=True)
            assert_close(o, ro, name=f"{name} out")
            assert_close(lg, rl, atol=1e-3, rtol=1e-3, name=f"{name} lse")
        flops = 2 * case.heads * case.context * (576 + 512) * case.batch
        for label, f in (("launcher", ref_fn), ("gluon", fn), ("launcher", ref_fn),
                         ("gluon", fn)):
            us = time_us(graphed(f))
            row = {"case": case.name("dense_decode/fp8", "fp8"), "kernel": label, "us": round(us, 2),
                   "TFLOPS": round(flops / us / 1e6, 1), "ceiling_TBps": ceiling,
                   "splits": plan.num_splits if label == "launcher" else 1}
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            with open(sys.argv[1], "w") as fh:
                json.dump({"env": env, "rows": rows_out}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
