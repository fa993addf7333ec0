"""Compile every kernel for SM80/86/89/90/100/120 (`TARGETS`) with the configuration its launcher
picks there and print one JSON line per compile: {"what", "cc", "shared", "cubin", "hw_cvt",
"trap", ...}.

Run as a script without TRITON_INTERPRET (the interpreter replaces @triton.jit functions);
tests/test_portability.py does that in a subprocess.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fp8mla.decode import (
    PDL_SIGNAL,
    SM90_ROWS_IN_ORDER,
    SPILL_WORDS,
    combine_warps,
)
from fp8mla.indexer import KEYS_AS_ROWS, PREFETCH_MIN_HEADS
from fp8mla.indexer import NUM_STAGES as INDEXER_STAGES
from fp8mla.indexer import TMA_STAGES as INDEXER_TMA_STAGES
from fp8mla.kernels.compact import _compact_indices_kernel
from fp8mla.kernels.decode import _combine_splits_kernel, _mla_decode_kernel
from fp8mla.kernels.indexer import _indexer_logits_kernel
from fp8mla.kernels.launch import OPTIONS
from fp8mla.kernels.rope import _rope_kernel
from fp8mla.kernels.rows import _quant_rows_kernel, _rms_norm_kernel
from fp8mla.kernels.store import _store_index_keys_kernel, _store_kv_kernel
from fp8mla.kernels.topk import _topk_kernel
from fp8mla.kernels.topk_chunked import (
    _topk_compact_kernel,
    _topk_finish_kernel,
    _topk_pass_kernel,
    _topk_sample_kernel,
)
from fp8mla.runtime import (
    block_shared_limit,
    decode_config,
    fit_shared,
    folds_scales,
    slots_ahead,
)
from fp8mla.sparse import COMPACT_MIN_ROWS

# Every configuration class the launchers have: SM80 (software e4m3, 163 KB, 64-row programs),
# SM86 (software e4m3, 99 KB: A10, A40, RTX 30xx), SM89 (hardware e4m3, 99 KB), SM90 (its own
# kernels), SM100 (227 KB, no 64-row programs), SM120 (99 KB). FP8MLA_COMPILE_TARGETS, a
# comma-separated list, compiles others instead: 87 (Orin: SM86's plans with 163 KB), 103
# (B300: SM100's), 110 (Thor: triton ≥ 3.8; 101 on 3.6), 121 (GB10: SM120's) — docs/kernels.md
# has their last run.
DEFAULT_TARGETS = (80, 86, 89, 90, 100, 120)
TARGETS = tuple(int(cc) for cc in os.environ.get("FP8MLA_COMPILE_TARGETS", "").split(",")
                if cc.strip()) or DEFAULT_TARGETS
FORMAT_IDS = {"bf16": 0, "fp8": 1, "fp8_ds_mla": 2}
ROW_BYTES = {"bf16": 1152, "fp8": 576, "fp8_ds_mla": 656}
DECODE_SHAPES = ((8, 1), (16, 2), (128, 1))  # (heads, s_q): BLOCK_M 16, 32 and 64 (the largest)
# sparse head counts compiled (by SM90 or not): on SM90 64-row programs take 3 stages
SPARSE_HEADS = {False: (8,), True: (8, 128)}
# where a TMA configuration's gathered variant (pages shorter than a tile) is compiled too: SM90,
# the one target whose gathered tiles take 3 stages (`decode_config`); elsewhere they run the 2
# stages the non-TMA and sparse compiles here already cover
GATHER_CC = 90
PDL_CC = 90  # griddepcontrol (programmatic dependent launch) needs SM90+
SM90_CC = 90  # `fp8mla.kernels.decode_sm90` (Gluon, wgmma / TMA): compute capability 9.0 only

DECODE_SIG = {
    "q_ptr": "*bf16", "u32_ptr": "*i32", "bf16_ptr": "*bf16", "f32_ptr": "*fp32",
    "fp8_scale_ptr": "*fp32", "lat_desc": "constexpr", "rope_desc": "constexpr",
    "scale_desc": "constexpr", "block_table_ptr": "*i32", "seqlens_ptr": "*i32",
    "out_ptr": "*bf16", "lse_ptr": "*fp32", "max_ptr": "*fp32", "part_out_ptr": "*fp32",
    "part_lse_ptr": "*fp32", "part_max_ptr": "*fp32",
    "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32", "stride_bt": "i32",
    "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32", "stride_lb": "i32",
    "stride_ls": "i32", "stride_lh": "i32", "softmax_scale": "fp32", "lse_empty": "fp32",
    "num_heads": "i32", "num_splits": "i32", "page_shift": "i32", "num_slots": "i32",
    "max_len": "i32",
}


def decode_tma_sig(fmt: str, block_n: int, fold: bool) -> dict:
    """DECODE_SIG with the descriptors `DecodePlan._descriptors` passes (TMA launches)."""
    n = block_n
    if fmt == "bf16":
        descs = {"lat_desc": f"tensordesc<bf16[{n}, 128]>", "rope_desc": f"tensordesc<bf16[{n}, 64]>"}
    elif fmt == "fp8":
        descs = {"lat_desc": f"tensordesc<i32[{n}, 128]>", "rope_desc": f"tensordesc<i32[{n}, 16]>"}
    else:
        descs = {"lat_desc": f"tensordesc<i32[{n}, 32]>" if fold else f"tensordesc<i32[{n}, 4, 32]>",
                 "rope_desc": f"tensordesc<bf16[{n}, 64]>", "scale_desc": f"tensordesc<fp32[{n}, 4]>"}
    return {**DECODE_SIG, **descs}


COMBINE_SIG = {
    "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "part_max_ptr": "*fp32", "out_ptr": "*bf16",
    "lse_ptr": "*fp32", "max_ptr": "*fp32",
    "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32", "stride_lb": "i32",
    "stride_ls": "i32", "stride_lh": "i32", "lse_empty": "fp32", "num_splits": "i32",
    "num_heads": "i32",
}
STORE_SIG = {
    "latent_ptr": "*bf16", "rope_ptr": "*bf16", "slot_ptr": "*i64", "scale_ptr": "*fp32",
    "u8_ptr": "*u8", "f32_ptr": "*fp32", "bf16_ptr": "*bf16", "stride_lt": "i32",
    "stride_rt": "i32", "num_slots": "i32",
}
INDEXER_SIG = {
    "q_ptr": "*i32", "w_ptr": "*fp32", "k_u32_ptr": "*i32", "k_f32_ptr": "*fp32",
    "k_scale_ptr": "*fp32", "keys_desc": "constexpr",
    "block_table_ptr": "*i32", "lo_ptr": "*i32", "hi_ptr": "*i32",
    "out_ptr": "*fp32", "stride_qr": "i32", "stride_wr": "i32", "stride_bt": "i32",
    "stride_or": "i32", "num_heads": "i32", "max_len": "i32", "page_shift": "i32",
    "span": "i32", "num_pages": "i32",
}
TOPK_SIG = {
    "logits_ptr": "*fp32", "out_ptr": "*i32", "block_table_ptr": "*i32", "length_ptr": "*i32",
    "stride_lr": "i32", "stride_or": "i32", "stride_bt": "i32", "k": "i32", "page_size": "i32",
    "num_cols": "i32",
}
CHUNK_PASS_SIG = {"logits_ptr": "*fp32", "length_ptr": "*i32", "ws_ptr": "*i32",
                  "stride_lr": "i32", "k": "i32", "num_cols": "i32", "num_chunks": "i32"}
CHUNK_COMPACT_SIG = {"logits_ptr": "*fp32", "length_ptr": "*i32", "ws_ptr": "*i32",
                     "runs_ptr": "*i32", "cval_ptr": "*fp32", "cpos_ptr": "*i32",
                     "stride_lr": "i32", "k": "i32", "num_cols": "i32", "num_chunks": "i32"}
CHUNK_SAMPLE_SIG = {"logits_ptr": "*fp32", "length_ptr": "*i32", "ws_ptr": "*i32",
                    "stride_lr": "i32", "k": "i32", "num_cols": "i32"}
CHUNK_FINISH_SIG = {"logits_ptr": "*fp32", "length_ptr": "*i32", "cval_ptr": "*fp32",
                    "cpos_ptr": "*i32", "runs_ptr": "*i32", "out_ptr": "*i32",
                    "block_table_ptr": "*i32", "ws_ptr": "*i32", "stride_lr": "i32",
                    "stride_or": "i32", "stride_bt": "i32", "k": "i32", "page_size": "i32",
                    "num_cols": "i32", "num_chunks": "i32"}
ROPE_SIG = {"x_ptr": "*bf16", "out_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
            "num_rows": "i32", "stride_xr": "i32", "stride_or": "i32"}
NORM_SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "stride_x": "i32",
            "stride_o": "i32", "n": "i32", "eps": "fp32"}
QUANT_SIG = {"x_ptr": "*fp32", "q_ptr": "*u8", "scale_ptr": "*fp32", "num_rows": "i32",
             "stride_x": "i32", "stride_q": "i32"}
KEYS_SIG = {"keys_ptr": "*bf16", "slot_ptr": "*i64", "u8_ptr": "*u8", "f32_ptr": "*fp32",
            "stride_kt": "i32", "page_size": "i32", "num_slots": "i32"}


def compile_for(fn, signature, constexprs, cc, num_warps=4, num_stages=2, aligned=False,
                maxnreg=None, unaligned=()):
    """Compile fn for target cc. aligned: pointers and strides marked divisible by 16 — the
    best case of what a launch specializes (pointers usually are; strides when they happen to
    be multiples of 16); it decides vectorized loads (SASS studies); ``unaligned``: the names
    left out of it. maxnreg: a register cap (`DecodeConfig.maxnreg`)."""
    sig = dict(signature)
    constexprs = {**{k: None for k, v in signature.items() if v == "constexpr"}, **constexprs}
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in signature.items()
             if aligned and (v.startswith("*") or k.startswith("stride"))
             and k not in unaligned}
    src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    options = {"num_warps": num_warps, "num_stages": num_stages, **OPTIONS}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def row(what, cc, kernel, config=None):
    """One compile's JSON line; config: the decode configuration compiled, where the launcher
    fitted it to the target's shared memory (`fitted_decode`): its tile and stages, whether it
    had to step down from `decode_config`'s, and its stack + local bytes a thread."""
    fit = {} if config is None else {"block_n": config[0].block_n, "fitted": config[1],
                                     "stages": [config[0].num_stages, config[0].tma_stages],
                                     "local": local_bytes(kernel)}
    return json.dumps({"what": what, "cc": cc, "shared": kernel.metadata.shared, **fit,
                       "cubin": bool(kernel.asm.get("cubin")),
                       "hw_cvt": "cvt.rn.f16x2.e4m3x2" in kernel.asm["ptx"],
                       "tma": "cp.async.bulk.tensor" in kernel.asm["ptx"],
                       "pdl": "griddepcontrol" in kernel.asm["ptx"],
                       "trap": "trap;" in kernel.asm["ptx"],
                       "cta_barriers": kernel.asm["ptx"].count("bar.sync"),
                       # float32 max that keeps NaN / that drops it (ftz or not)
                       "max_nan": len(re.findall(r"max(\.ftz)?\.NaN\.f32", kernel.asm["ptx"])),
                       "max_num": len(re.findall(r"max(\.ftz)?\.f32", kernel.asm["ptx"])),
                       # global stores by width: 16, 8 and 4 bytes a thread
                       "stores": {w: kernel.asm["ptx"].count(f"st.global.{w}b32")
                                  for w in ("v4.", "v2.", "")}})


# (dims, splits a step) of combine programs (`fp8mla.decode.combine_blocks`): whole and part
# rows, then the narrow programs of few rows and many splits (B=1 × 128K: 16 × 256)
COMBINE_STEPS = ((512, 2), (512, 8), (256, 8), (256, 16), (128, 16), (128, 32), (64, 64),
                 (32, 128), (16, 256))


def combine_compile(cc, block_d, block_s, parts="*bf16", num_warps=None, aligned=False,
                    pdl=False):
    """The split combine (`_combine_splits_kernel`) for sm_``cc`` over ``parts`` partials
    ("*bf16" / "*fp32") in programs of ``block_d`` dims × ``block_s`` splits a step, with the
    launcher's warps (`fp8mla.decode.combine_warps`) where ``num_warps`` is None."""
    if num_warps is None:
        num_warps = combine_warps(block_d, 2 if parts == "*bf16" else 4)
    return compile_for(_combine_splits_kernel, {**COMBINE_SIG, "part_out_ptr": parts},
                       {"S_Q": 1, "DIM": 512, "BLOCK_D": block_d, "BLOCK_S": block_s,
                        "PDL": pdl}, cc, num_warps=num_warps, aligned=aligned)


def decode_compile(cc, fmt, cfg, s_q, sparse, tma, aligned=False, pdl=False,
                   misaligned_pool=False):
    """`_mla_decode_kernel` as a plan with config ``cfg`` launches it: whole tiles by TMA
    (``tma``: the descriptors' signature, cfg.tma_stages) or every tile gathered (cfg.num_stages,
    the next tile's slots carried from 3 stages on). aligned: as `compile_for` (SASS studies:
    `benchmarks/sass_decode.py`); pdl: signalling a programmatic dependent (`fp8mla.decode.PDL`);
    misaligned_pool: aligned but for the pool's three views (a pool not 16-byte aligned)."""
    hw = cc >= 89
    sig, stages = DECODE_SIG, cfg.num_stages
    if tma:
        fold = folds_scales(fmt, triton.next_power_of_2(s_q) * cfg.heads_per_block,
                            cfg.fold_scales)
        sig, stages = decode_tma_sig(fmt, cfg.block_n, fold), cfg.tma_stages
    return compile_for(_mla_decode_kernel, sig, {
        "FORMAT": FORMAT_IDS[fmt], "HW_FP8": hw, "DOT_F32": False, "S_Q": s_q,
        "S_Q_P2": triton.next_power_of_2(s_q), "HEADS": cfg.heads_per_block,
        "BLOCK_N": cfg.block_n, "DIRECT": False, "ROW_WORDS": ROW_BYTES[fmt] // 4,
        "SW_SCALE": 1.0 if hw else 256.0, "WORDS_2D": cfg.words_2d, "SPARSE": sparse,
        "CAUSAL": True, "FOLD_SCALES": cfg.fold_scales, "TMA": tma,
        "CARRY": slots_ahead(cfg.num_stages, tma, cfg.lookahead), "LAZY": cfg.lazy_rescale,
        "LATE_SUM": cfg.late_sum, "PDL": pdl,
    }, cc, cfg.num_warps, stages, aligned=aligned or misaligned_pool, maxnreg=cfg.maxnreg,
        unaligned=("u32_ptr", "bf16_ptr", "f32_ptr") if misaligned_pool else ())


# the CUDA tools Triton's wheel carries (cuobjdump, nvdisasm, ptxas)
NVIDIA_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def resource_usage(kernel) -> str | None:
    """cuobjdump's resource usage of a compiled kernel's cubin (registers, stack, local and
    shared memory); None without the cuobjdump Triton's wheel carries."""
    tool = os.path.join(NVIDIA_BIN, "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                              text=True, check=True).stdout


def local_bytes(kernel) -> int | None:
    """Stack + local memory a thread of a compiled kernel holds (`resource_usage`: what the
    driver reports as the function's local size, Triton's ``n_spills`` × 4); None where
    cuobjdump is missing."""
    usage = resource_usage(kernel)
    return None if usage is None else sum(
        int(m) for m in re.findall(r"(?:STACK|LOCAL):(\d+)", usage))


def fitted_decode(cc, fmt, cfg, s_q, sparse, tma):
    """`decode_compile` of the config a plan launches on sm_``cc``: ``cfg`` fitted to the
    target's shared memory as `fp8mla.decode.DecodePlan` fits it (`fit_shared`; spills read
    offline from the cubin, as the plan reads them from the loaded binary). Compiled with
    pointers and strides aligned, as the plan's own compiles (its stand-in tensors) and its
    launches on torch's allocations are: such a compile can need more shared memory than an
    unaligned one (wider copies staged; triton 3.6, sm_120, 8-head fp8: 94,240 B against
    75,808). Returns (compiled, (config, whether it stepped down)) — `row`'s arguments after
    the name."""
    def spills(kernel):
        local = local_bytes(kernel)
        return None if local is None else local > 4 * SPILL_WORDS

    fitted, kernel = fit_shared(
        cfg, tma, lambda c: decode_compile(cc, fmt, c, s_q, sparse, tma, aligned=True),
        block_shared_limit(cc), spills=spills)
    return kernel, (fitted, fitted != cfg)


def indexer_compile(cc, heads, keys_as_rows=KEYS_AS_ROWS):
    """`_indexer_logits_kernel` as the decode indexer launches it on sm_``cc`` (fp8 q, pages of
    64 keys: whole pages by TMA copies from SM90 on); keys_as_rows: the score orientation
    (`fp8mla.indexer.KEYS_AS_ROWS`; SASS studies: `benchmarks/sass_indexer.py`)."""
    hw, tma = cc >= 89, cc >= 90
    sig = dict(INDEXER_SIG, keys_desc="tensordesc<i32[1, 64, 32]>") if tma else INDEXER_SIG
    return compile_for(_indexer_logits_kernel, sig, {
        "S_Q": 1, "H_P2": heads, "BLOCK_S": 64, "PAGED": True, "Q_FP8": True, "HW_FP8": hw,
        "DOT_F32": False, "OUT_SCALE": 1.0 if hw else 65536.0, "KEYS_AS_ROWS": keys_as_rows,
        "ROWS_ALIGNED": True, "PREFETCH": not tma and heads >= PREFETCH_MIN_HEADS, "TMA": tma,
        "ROW_LENS": False},
        cc, num_stages=INDEXER_TMA_STAGES if tma else INDEXER_STAGES, aligned=True)


def indexer_sm90_compile(heads, paged=True, s_q=1):
    """The Gluon SM90 indexer (`fp8mla.kernels.indexer_sm90`) for sm_90 as the launcher takes
    it for fp8 q (``heads`` padded as it pads them; ``paged``: the decode form's pages, else
    contiguous keys); None where this Triton has no (such) Gluon."""
    from fp8mla.kernels import indexer_sm90 as ki

    if not ki.AVAILABLE:
        return None
    lay = ki.gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    sig = {"q_ptr": "*u8", "w_ptr": "*fp32",
           "keys_desc": f"tensordesc<fp8e4nv[{ki.BLOCK_S}, 128],{lay!r}>",
           "k_f32_ptr": "*fp32", "k_scale_ptr": "*fp32", "block_table_ptr": "*i32",
           "lo_ptr": "*i32", "hi_ptr": "*i32", "out_ptr": "*fp32", "stride_qr": "i32",
           "stride_wr": "i32", "stride_bt": "i32", "stride_or": "i32", "num_heads": "i32",
           "max_len": "i32", "page_shift": "i32", "page_rows": "i32", "span": "i32",
           "num_pages": "i32"}
    return _gluon_sm90_compile(ki._indexer_sm90_kernel, sig, {
        "S_Q": s_q, "H": max(16, triton.next_power_of_2(heads)), "PAGED": paged, "NS": ki.NS,
        "KSPLIT": ki.KSPLIT, "ROW_LENS": False},
        pointers=("q_ptr", "w_ptr", "out_ptr", "stride_qr", "stride_wr", "stride_or"),
        num_warps=ki.NUM_WARPS)


def _gluon_sm90_compile(fn, sig, consts, pointers=(), num_warps=None):
    """A `fp8mla.kernels.decode_sm90` kernel for sm_90: ``sig`` its runtime arguments, ``consts``
    its constexprs, ``pointers`` those marked 16-byte aligned."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from fp8mla.kernels import decode_sm90 as k90

    if "PDL" in fn.arg_names and "PDL" not in consts:  # as the launcher: the combine
        consts = {**consts, "PDL": PDL_SIGNAL and not consts["DIRECT"]}  # signalled
    sig = {**sig, **{k: "constexpr" for k in consts}}
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in pointers}
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v
                                              for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps or k90.NUM_WARPS, **OPTIONS})


def _dense_sm90_sig(strides):
    """The runtime signature of the dense Gluon SM90 kernels (TMA descriptors over fp8 rows),
    with ``strides`` the i32 strides they take."""
    from fp8mla.kernels import decode_sm90 as k90

    lat, rope = (k90.gl.NVMMASharedLayout(swizzle_byte_width=w, element_bitwidth=8, rank=2)
                 for w in (128, 64))
    return {"q_ptr": "*bf16", "lat_desc": f"tensordesc<u8[{k90.BLOCK_N}, 128],{lat!r}>",
            "rope_desc": f"tensordesc<u8[{k90.BLOCK_N}, 64],{rope!r}>", "bt_ptr": "*i32",
            "seqlens_ptr": "*i32", "scale_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
            "max_ptr": "*fp32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
            "part_max_ptr": "*fp32", **{k: "i32" for k in strides}, "softmax_scale": "fp32",
            "lse_empty": "fp32", "num_heads": "i32", "num_splits": "i32", "page_shift": "i32",
            "max_len": "i32"}


def decode_sm90_compile(direct=False, in_order=None, parts="*bf16", s_q=1, pack=False):
    """The Gluon SM90 decode kernel (`fp8mla.kernels.decode_sm90`) for sm_90, as the launcher
    takes it for fp8 64-head programs (``in_order``: its bf16 rows stored in dim order,
    `fp8mla.decode.SM90_ROWS_IN_ORDER` where None; ``parts``: the partials' type — bf16, as
    `partials_dtype` gives it there, its pointers and strides marked 16-byte aligned as a launch
    specializes them, or float32; ``s_q``: queries a request, causal; ``pack``: every query's
    heads in one program, `fp8mla.decode.SM90_PACKED`); None where this Triton has no (such)
    Gluon."""
    from fp8mla.kernels import decode_sm90 as k90

    if not k90.AVAILABLE:
        return None
    sig = _dense_sm90_sig(("stride_qb", "stride_qs", "stride_qh", "stride_bt", "stride_ob",
                           "stride_os", "stride_oh", "stride_lb", "stride_ls", "stride_lh"))
    return _gluon_sm90_compile(k90._mla_decode_sm90_kernel, {**sig, "part_out_ptr": parts}, {
        "DIRECT": direct, "HEADS": k90.HEADS, "BN": k90.BLOCK_N,
        "IN_ORDER": SM90_ROWS_IN_ORDER if in_order is None else in_order, "S_Q": s_q, "CAUSAL": True,
        "PACK": pack}, pointers=_aligned(sig) if parts != "*fp32" else ())


def _aligned(sig):
    """The arguments a launch marks 16-byte aligned: pointers and strides (`compile_for`)."""
    return tuple(k for k, v in sig.items() if v.startswith("*") or k.startswith("stride"))


def decode_mma8_compile(direct=False, s_q=1, heads=8, causal=True, rows=None, stages=None,
                        qk8=None):
    """The Gluon SM90 decode kernel of ≤ 16-row programs (`fp8mla.kernels.decode_sm90_mma8`)
    for sm_90, as the launcher takes it for fp8 plans of s_q × heads ≤ 16 (``rows``: the
    program's rows, from s_q × heads where None; ``stages``: the ring's, the launcher's where
    None; ``qk8``: the wide form's FP8 first product, the launcher's choice where None); None
    where this Triton has no (such) Gluon."""
    import fp8mla.decode as decode_mod
    from fp8mla.kernels import decode_sm90_mma8 as k8

    if not k8.AVAILABLE:
        return None
    rows = rows or k8.rows_for(s_q * heads)
    if qk8 is None:  # (for long programs: `fp8mla.decode.SM90_MMA16_QK8_MIN_TILES`)
        qk8 = decode_mod.SM90_MMA16_QK8 and rows == k8.WIDE_ROWS
    sig = _dense_sm90_sig(("stride_qb", "stride_qs", "stride_qh", "stride_bt", "stride_ob",
                           "stride_os", "stride_oh", "stride_lb", "stride_ls", "stride_lh"))
    lat = k8.gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3)
    sig["lat_desc"] = f"tensordesc<u8[4, {k8.BLOCK_N}, 128],{lat!r}>"
    sig["len_hint"] = "i32"
    return _gluon_sm90_compile(k8._mla_decode_mma8_kernel, sig, {
        "DIRECT": direct, "S_Q": s_q, "HEADS": heads, "CAUSAL": causal, "R": rows,
        "NS": stages or decode_mod.mma8_stages(rows), "stamp_ptr": None, "TIMELINE": False,
        "QK8": qk8, "PDL": PDL_SIGNAL and not direct and rows == k8.ROWS},  # (as launched)
        num_warps=k8.NUM_WARPS)


def decode_mma8_ds_compile(direct=False, s_q=1, heads=8, causal=True, stages=None, rows=None,
                           qk8=None):
    """The Gluon SM90 decode kernel of ≤ 16-row programs over fp8_ds_mla pages
    (`fp8mla.kernels.decode_sm90_mma8_ds`) for sm_90, with ``stages`` ring stages (the
    launcher's default where None) and ``rows`` program rows (from s_q × heads where None);
    None where this Triton has no (such) Gluon."""
    import fp8mla.decode as decode_mod
    from fp8mla.kernels import decode_sm90_mma8_ds as kd
    from fp8mla.kernels.decode_sm90_mma8 import rows_for

    if not kd.AVAILABLE:
        return None
    rows = rows or rows_for(s_q * heads)
    lay = {r: kd.gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=r)
           for r in (2, 3)}
    dense = _dense_sm90_sig(("stride_qb", "stride_qs", "stride_qh", "stride_bt", "stride_ob",
                             "stride_os", "stride_oh", "stride_lb", "stride_ls", "stride_lh"))
    # the dense signature with the fp8_ds_mla boxes, the rows' float32 view in place of the
    # per-tensor scale, and the pool's row count
    sig = {"q_ptr": "*bf16", "lat_desc": f"tensordesc<u8[4, {kd.BLOCK_N}, 128],{lay[3]!r}>",
           "rope_desc": f"tensordesc<u8[{kd.BLOCK_N}, 128],{lay[2]!r}>", "f32_ptr": "*fp32",
           **{k: v for k, v in dense.items()
              if k not in ("q_ptr", "lat_desc", "rope_desc", "scale_ptr")},
           "num_slots": "i32", "len_hint": "i32"}
    return _gluon_sm90_compile(kd._mla_decode_mma8_ds_kernel, sig, {
        "DIRECT": direct, "S_Q": s_q, "HEADS": heads, "CAUSAL": causal,
        "NS": stages or decode_mod.SM90_MMA8_DS_STAGES, "R": rows,
        "QK8": (decode_mod.SM90_MMA8_DS_QK8 and rows == 16) if qk8 is None else qk8},
        pointers=("q_ptr", "f32_ptr", "bt_ptr"), num_warps=kd.NUM_WARPS)


def sparse_sm90_compile(direct=False, in_order=None, parts="*bf16", paged=False, s_q=1,
                        ds=True, pack=False):
    """The Gluon SM90 gather kernel over index lists (`fp8mla.kernels.decode_sm90`) for
    sm_90 (``in_order``, ``parts``: as `decode_sm90_compile`'s), or, ``paged``, its form over
    block tables (dense, ``s_q`` queries a request; ``pack``: every query's heads in one
    program), over fp8_ds_mla rows or (not ``ds``) the fp8 format's; None where this Triton has
    no (such) Gluon."""
    from fp8mla.kernels import decode_sm90 as k90

    if not k90.AVAILABLE:
        return None
    sig = {"q_ptr": "*bf16", "u8_ptr": "*u8", "f32_ptr": "*fp32", "list_ptr": "*i32",
           "count_ptr": "*i32", "scale_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
           "max_ptr": "*fp32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
           "part_max_ptr": "*fp32",
           **{k: "i32" for k in ("stride_qb", "stride_qs", "stride_qh", "stride_list",
                                 "stride_ob", "stride_os", "stride_oh", "stride_lb",
                                 "stride_ls", "stride_lh")},
           "softmax_scale": "fp32", "lse_empty": "fp32", "num_heads": "i32",
           "num_splits": "i32", "max_len": "i32", "num_slots": "i32", "page_shift": "i32"}
    return _gluon_sm90_compile(k90._mla_sparse_sm90_kernel, {**sig, "part_out_ptr": parts}, {
        "DIRECT": direct, "HEADS": k90.HEADS, "BN": k90.BLOCK_N,
        "IN_ORDER": SM90_ROWS_IN_ORDER if in_order is None else in_order, "PAGED": paged,
        "S_Q": s_q, "CAUSAL": True, "DS": ds, "PACK": pack},
        pointers=_aligned(sig) if parts != "*fp32" else ("q_ptr", "u8_ptr", "f32_ptr",
                                                         "list_ptr"))


def sparse_mma8_compile(direct=False, heads=8, stages=None, qk8=None, timeline=False):
    """The Gluon SM90 sparse kernel of ≤ 8-row programs over fp8_ds_mla index lists
    (`fp8mla.kernels.decode_sm90_mma8_sparse`) for sm_90, with ``stages`` ring stages (the
    launcher's default where None) and, ``timeline``, its debug stamps; None where this Triton
    has no (such) Gluon."""
    import fp8mla.decode as decode_mod
    from fp8mla.kernels import decode_sm90_mma8_sparse as km

    if not km.AVAILABLE:
        return None
    sig = {"q_ptr": "*bf16", "u8_ptr": "*u8", "f32_ptr": "*fp32", "list_ptr": "*i32",
           "count_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "max_ptr": "*fp32",
           "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "part_max_ptr": "*fp32",
           **{k: "i32" for k in ("stride_qb", "stride_qh", "stride_list", "stride_ob",
                                 "stride_oh", "stride_lb", "stride_lh")},
           "softmax_scale": "fp32", "lse_empty": "fp32", "num_heads": "i32",
           "num_splits": "i32", "max_len": "i32", "num_slots": "i32", "len_hint": "i32",
           **({"stamp_ptr": "*i64"} if timeline else {})}
    return _gluon_sm90_compile(km._mla_sparse_mma8_kernel, sig, {
        "DIRECT": direct, "HEADS": heads,
        "NS": stages or decode_mod.SPARSE_SM90_MMA8_STAGES,
        "QK8": decode_mod.SPARSE_SM90_MMA8_QK8 if qk8 is None else qk8,
        **({"TIMELINE": True} if timeline else {"stamp_ptr": None, "TIMELINE": False})},
        pointers=("q_ptr", "u8_ptr", "f32_ptr", "list_ptr"), num_warps=km.NUM_WARPS)


def compile_target(cc):
    """All kernels for one target; returns JSON lines."""
    lines = []
    for fmt, fid in FORMAT_IDS.items():
        for heads, s_q in DECODE_SHAPES:
            cfg = decode_config(cc, fmt, heads, s_q)
            kernel, fit = fitted_decode(cc, fmt, cfg, s_q, False, cfg.tma)
            lines.append(row(f"decode/{fmt}/H{heads}-sq{s_q}", cc, kernel, fit))
            # a pool not 16-byte aligned: the same config, every tile gathered from it
            lines.append(row(f"decode/{fmt}/H{heads}-sq{s_q}-misaligned", cc, decode_compile(
                cc, fmt, fit[0], s_q, False, False, misaligned_pool=True), fit))
            if cfg.tma and cc == GATHER_CC:  # pages shorter than a tile: every tile gathered
                lines.append(row(f"decode/{fmt}/H{heads}-sq{s_q}-gather", cc,
                                 *fitted_decode(cc, fmt, cfg, s_q, False, False)))
        if cc == SM90_CC and fmt != "bf16":  # packed plans' fallback (`SM90_PACKED`: s_q 4 ×
            cfg = decode_config(cc, fmt, 16, 4)  # 16 heads), a misaligned pool, as the plan
            # launches it: `decode_config`'s config, never fitted (sm90 plans compile none)
            lines.append(row(f"decode/{fmt}/H16-sq4-misaligned", cc, decode_compile(
                cc, fmt, cfg, 4, False, False, misaligned_pool=True), (cfg, False)))
        for heads in SPARSE_HEADS[cc == 90]:
            cfg = decode_config(cc, fmt, heads, 1, sparse=True)
            checks = cfg.heads_per_block < COMPACT_MIN_ROWS  # else lists compacted first
            lines.append(row(f"sparse/{fmt}/H{heads}", cc,
                             *fitted_decode(cc, fmt, cfg, 1, checks, False)))
        k = compile_for(_store_kv_kernel, STORE_SIG, {
            "ROW_BYTES": ROW_BYTES[fmt], "FORMAT": fid, "POW2": True, "LATENT": 512,
            "ROPE": 64, "TILE": 128}, cc)
        lines.append(row(f"store/{fmt}", cc, k))
    # many rows; few; one long request — partials in bf16 and float32 (by kernel:
    # `fp8mla.decode.partials_dtype`), the launcher's warps (`combine_warps`)
    for block_d, block_s in ((512, 8), (32, 128), (16, 256)):
        for parts in ("*bf16", "*fp32"):
            lines.append(row(f"combine/D{block_d}-{parts[1:]}", cc,
                             combine_compile(cc, block_d, block_s, parts)))
    if cc == SM90_CC:  # every program width, both partial types; and 4 warps over bf16 rows
        for block_d, block_s in COMBINE_STEPS:  # (before session 32) and 16-dim ones (33)
            for parts in ("*bf16", "*fp32"):
                lines.append(row(f"combine/D{block_d}-S{block_s}-{parts[1:]}", cc,
                                 combine_compile(cc, block_d, block_s, parts, aligned=True)))
        for block_d, block_s in ((512, 2), (16, 256)):
            lines.append(row(f"combine/D{block_d}-S{block_s}-bf16-4warps", cc,
                             combine_compile(cc, block_d, block_s, "*bf16", num_warps=4,
                                             aligned=True)))
    if cc >= PDL_CC:  # programmatic dependent launch (griddepcontrol: SM90+; the default on SM90)
        lines.append(row("combine/D512-pdl", cc, combine_compile(cc, 512, 8, pdl=True)))
        if cc == GATHER_CC:
            lines.append(row("decode/fp8/H16-sq1-pdl", cc, decode_compile(
                cc, "fp8", decode_config(cc, "fp8", 16, 1), 1, False, True, pdl=True)))
    if cc == SM90_CC:  # the Gluon kernels (where Triton has them): 64-head and ≤ 16-row programs
        # the 64-row kernels as plans launch them (bf16 rows in dim order, bf16 partials), and
        # with `SM90_ROWS_IN_ORDER` off (the accumulator's stores, float32 partials)
        acc_rows = {"in_order": False, "parts": "*fp32"}
        gluon = [("decode_sm90/fp8/H128", decode_sm90_compile, {}),
                 ("sparse_sm90/fp8_ds_mla/H128", sparse_sm90_compile, {}),
                 ("decode_sm90/fp8/H128-acc-rows", decode_sm90_compile, acc_rows),
                 ("sparse_sm90/fp8_ds_mla/H128-acc-rows", sparse_sm90_compile, acc_rows),
                 ("paged_sm90/fp8_ds_mla/H128", sparse_sm90_compile, {"paged": True}),
                 ("decode_sm90/fp8/H128-sq2", decode_sm90_compile, {"s_q": 2}),
                 ("paged_sm90/fp8_ds_mla/H128-sq2", sparse_sm90_compile,
                  {"paged": True, "s_q": 2}),
                 ("paged_sm90/fp8/H128", sparse_sm90_compile, {"paged": True, "ds": False}),
                 ("sparse_sm90/fp8/H128", sparse_sm90_compile, {"ds": False}),
                 # every query's heads in one program (`SM90_PACKED`: s_q 4 × 16 heads)
                 ("decode_sm90/fp8/H16-sq4-packed", decode_sm90_compile,
                  {"s_q": 4, "pack": True}),
                 ("paged_sm90/fp8_ds_mla/H16-sq4-packed", sparse_sm90_compile,
                  {"paged": True, "s_q": 4, "pack": True}),
                 ("decode_mma8/fp8/H8", decode_mma8_compile, {}),
                 ("decode_mma16/fp8/H16", decode_mma8_compile, {"heads": 16}),
                 ("decode_mma16/fp8/H8-sq2", decode_mma8_compile,  # (also MTP × 16 heads'
                  {"heads": 8, "s_q": 2}),  # head blocks)
                 ("decode_mma16_qk8/fp8/H16", decode_mma8_compile,  # (fp8_scores=True)
                  {"heads": 16, "qk8": True}),
                 ("decode_mma8/fp8_ds_mla/H8", decode_mma8_ds_compile, {}),
                 ("decode_mma16/fp8_ds_mla/H16", decode_mma8_ds_compile, {"heads": 16}),
                 ("decode_mma16_qk8/fp8_ds_mla/H16", decode_mma8_ds_compile,
                  {"heads": 16, "qk8": True}),
                 ("sparse_mma8/fp8_ds_mla/H8", sparse_mma8_compile, {}),
                 ("sparse_mma8_qk8/fp8_ds_mla/H8", sparse_mma8_compile,  # (off by default)
                  {"qk8": True})]
        for direct in (False, True):
            for name, compile_fn, kw in gluon:
                k = compile_fn(direct, **kw)
                if k is not None:
                    lines.append(row(f"{name}{'-direct' * direct}", cc, k))
        for heads in (64,):  # fp8 q from SM90_MIN_HEADS (33: 64 padded): paged, contiguous
            for paged in (True, False):
                k = indexer_sm90_compile(heads, paged)
                if k is not None:
                    lines.append(row(f"indexer_sm90/Hi{heads}{'' if paged else '-ragged'}", cc,
                                     k))
    lines.append(row("compact_indices", cc, compile_for(_compact_indices_kernel, {
        "idx_ptr": "*i32", "len_ptr": "*i32", "out_ptr": "*i32", "count_ptr": "*i32",
        "stride_idx": "i32", "stride_out": "i32", "topk": "i32", "num_slots": "i32"},
        {"BLOCK": 2048}, cc)))
    lines.append(row("store/index_keys", cc, compile_for(_store_index_keys_kernel, KEYS_SIG,
                                                         {"DIM": 128, "POW2": False}, cc)))
    for heads in (32, 64):  # GLM-5, DeepSeek-V3.2 index heads; fp8 q, paged keys (decode)
        lines.append(row(f"indexer/Hi{heads}", cc, indexer_compile(cc, heads)))
    lines.append(row("rms_norm", cc, compile_for(_rms_norm_kernel, NORM_SIG, {"BLOCK": 2048},
                                                 cc)))
    lines.append(row("quant_rows", cc, compile_for(_quant_rows_kernel, QUANT_SIG, {
        "DIM": 128, "BLOCK_R": 8}, cc)))
    for out_t in ("fp32", "bf16"):
        lines.append(row(f"rope/{out_t}", cc, compile_for(_rope_kernel, {
            **ROPE_SIG, "out_ptr": f"*{out_t}"}, {
            "ROWS_PER_TOKEN": 8, "D": 128, "INTERLEAVE": True, "BLOCK_R": 16}, cc)))
    # the smallest launch, a register-resident row with a tail, the largest (multi-step) one
    for block, tail, warps, one in ((1024, 0, 4, True), (4096, 256, 8, True),
                                    (4096, 1024, 8, True), (8192, 0, 16, False)):
        lines.append(row(f"topk/{block}+{tail}", cc, compile_for(_topk_kernel, TOPK_SIG, {
            "BLOCK": block, "ONE_BLOCK": one, "TAIL": tail, "ROWS_PER_REQ": 1,
            "TO_SLOTS": True}, cc, num_warps=warps)))
    for kern, sig, extra in (
            (_topk_pass_kernel, CHUNK_PASS_SIG, {"FIRST": False, "CHUNK": 8192}),
            (_topk_sample_kernel, CHUNK_SAMPLE_SIG, {"CAP": 8192, "SAMPLES": 4096}),
            (_topk_compact_kernel, CHUNK_COMPACT_SIG, {"CAP": 8192, "CHUNK": 8192,
                                                       "SAMPLED": True})):
        lines.append(row(f"topk_chunked/{kern.__name__}", cc, compile_for(
            kern, sig, extra, cc, num_warps=16)))
    for sampled in (False, True):
        lines.append(row(f"topk_chunked/_topk_finish_kernel/sampled{int(sampled)}", cc,
                         compile_for(_topk_finish_kernel, CHUNK_FINISH_SIG, {
                             "CAP": 8192, "CHUNK": 1024, "CHUNKS_P2": 256, "ROWS_PER_REQ": 1,
                             "TO_SLOTS": True, "SAMPLED": sampled}, cc, num_warps=16)))
    return lines


def main(out_path: str | None = None):
    """Every target's lines to stdout, or (``out_path``) to that file, which appears only once
    complete (written beside it, then renamed), its last line {"exit": 0} or the error's text
    — what the test processes of one run wait for (tests/conftest.py)."""
    # two processes: compiling is CPU-bound and the CI machine has two cores
    workers = int(os.environ.get("FP8MLA_COMPILE_WORKERS", 2))
    out = open(out_path + ".part", "w") if out_path else sys.stdout
    status = {"exit": 1}
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for lines in pool.map(compile_target, TARGETS):
                for line in lines:
                    print(line, file=out, flush=True)
        status = {"exit": 0}
    except BaseException:
        status["error"] = traceback.format_exc()[-3000:]
        raise
    finally:
        if out_path:
            print(json.dumps(status), file=out)
            out.close()
            os.replace(out_path + ".part", out_path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
