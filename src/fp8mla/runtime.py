"""Where kernels run: CUDA device facts, the Triton interpreter, launch configurations."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

__all__ = ["interpreting", "Target", "target_for", "DecodeConfig", "decode_config",
           "folds_scales", "resident_programs", "slots_ahead"]


def interpreting() -> bool:
    """True when Triton runs kernels through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class Target:
    """What a launcher needs to know about the device: compute capability (major·10 + minor),
    SM count, and whether kernels run interpreted."""

    cc: int
    num_sms: int
    interpreted: bool = False

    @property
    def hw_fp8(self) -> bool:
        """Hardware e4m3 conversion (``cvt.rn.f16x2.e4m3x2``) exists from SM89 on."""
        return not self.interpreted and self.cc >= 89


@functools.cache
def _cuda_target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    return Target(cc=props.major * 10 + props.minor, num_sms=props.multi_processor_count)


def target_for(device: torch.device) -> Target:
    """The `Target` for tensors on ``device``; CPU tensors need the interpreter."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device: {device} asked for, but this torch finds no CUDA GPU "
                               f"(on a CPU: device 'cpu' with TRITON_INTERPRET=1)")
        return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())
    if interpreting():
        return Target(cc=90, num_sms=4, interpreted=True)
    raise needs_cuda(device)


def needs_cuda(device: torch.device) -> RuntimeError:
    """The error of a kernel launch over tensors on ``device`` (not CUDA) without the
    interpreter."""
    return RuntimeError(
        f"fp8mla kernels need CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before "
        f"triton is first imported; got tensors on {device}"
    )


@dataclass(frozen=True)
class DecodeConfig:
    """Tile sizes and launch parameters of the dense decode kernel."""

    block_n: int
    heads_per_block: int
    num_warps: int
    num_stages: int
    words_2d: bool = False  # FP8 rows as one [BLOCK_N, 128]-word load instead of [BLOCK_N, 4, 32]
    # fp8_ds_mla at ≤ 16 rows: scales applied to the float32 scores and P per 128-dim tile
    # instead of multiplied into each fp16 tile (scores exact in float32; P · scale rounded
    # to fp16, as P was)
    fold_scales: bool = True
    # SM90+: tiles that lie inside one page (page_size >= block_n) are copied by the tensor
    # memory accelerator, tma_stages deep (3: two buffers, the copy two tiles ahead)
    tma: bool = False
    tma_stages: int = 3
    # gathered tiles at ≥ 3 stages look their slots up this many tiles ahead (`slots_ahead`;
    # 2: the entries are loaded two tiles ahead and turned into slots one ahead); TMA plans
    # and 2-stage plans ignore it
    lookahead: int = 1
    # registers per thread the compiler may use (Triton's ``maxnreg``; None: its choice). A
    # cap that lets one more program fit on an SM (65,536 registers per SM: ≤ 168 for three
    # 4-warp programs) trades spills for occupancy; `resident_programs` sees the cap
    maxnreg: int | None = None
    # online softmax (kernels/decode.py `_softmax_tile`; the same result up to P's fp16
    # rounding): the accumulators are rescaled only when some row's max has grown by more than
    # a factor 2⁸ since the last rescale (lazy_rescale); P's row sums are kept per tile column
    # and summed once at the end (late_sum)
    lazy_rescale: bool = False
    late_sum: bool = False

    def __post_init__(self) -> None:
        """A tuning hook still gets a named error, not a Triton failure at launch."""
        pow2 = {"block_n": (16, 128), "heads_per_block": (1, 64), "num_warps": (1, 16)}
        for name, (lo, hi) in pow2.items():
            v = getattr(self, name)
            if type(v) is not int or not lo <= v <= hi or v & (v - 1):
                raise ValueError(f"DecodeConfig.{name}: expected a power of two in [{lo}, {hi}], "
                                 f"got {v!r}")
        if self.maxnreg is not None and (type(self.maxnreg) is not int
                                         or not 24 <= self.maxnreg <= 248 or self.maxnreg % 8):
            raise ValueError(f"DecodeConfig.maxnreg: expected None or a multiple of 8 in "
                             f"[24, 248], got {self.maxnreg!r}")
        if type(self.lookahead) is not int or self.lookahead not in (1, 2):
            raise ValueError(f"DecodeConfig.lookahead: expected 1 or 2, got {self.lookahead!r}")
        for name in ("num_stages", "tma_stages"):
            v = getattr(self, name)
            if type(v) is not int or not 1 <= v <= 8:
                raise ValueError(f"DecodeConfig.{name}: expected an int in [1, 8], got {v!r}")
        for name in ("words_2d", "fold_scales", "tma", "lazy_rescale", "late_sum"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"DecodeConfig.{name}: expected a bool, got "
                                f"{type(getattr(self, name)).__name__}")


# Per-SM limits by compute capability (CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability"): shared memory per SM in bytes (1 KB of it reserved per block) and
# resident warps per SM. Registers: 64K 32-bit per SM on all of them, allocated per warp in
# units of 256.
_SM_SHARED = {80: 167936, 86: 102400, 87: 167936, 89: 102400, 90: 233472, 100: 233472,
              103: 233472, 120: 102400, 121: 102400}
_SM_WARPS = {80: 64, 86: 48, 87: 48, 89: 48, 90: 64, 100: 64, 103: 64, 120: 48, 121: 48}


def resident_programs(cc: int, num_warps: int, regs_per_thread: int, shared_bytes: int) -> int:
    """Programs (thread blocks) of a kernel one SM holds at once: the tightest of registers,
    shared memory and warps (at least 1)."""
    warp_regs = -(-regs_per_thread * 32 // 256) * 256
    by_regs = (65536 // max(1, warp_regs)) // num_warps
    by_smem = _SM_SHARED.get(cc, 102400) // (shared_bytes + 1024)
    by_warps = _SM_WARPS.get(cc, 48) // num_warps
    return max(1, min(by_regs, by_smem, by_warps, 32))


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _max_block_m(cc: int) -> int:
    # 99 KB shared-memory parts (SM86/89/120/121): four bf16 [64, 128] q lanes plus the KV
    # tiles exceed it (SM87, Orin, has SM80's 163 KB but takes their 32 rows: unmeasured,
    # compiled offline — docs/kernels.md). SM100+: four [64, 128] fp32 accumulators plus the
    # score tile overflow the 512 tensor-memory columns (Triton 3.9 then compiles the kernel to
    # a bare `trap`). Both found by tests/test_portability.py.
    return 64 if cc in (80, 90) else 32


FOLD_MAX_ROWS = 16  # the kernel's FOLD_SCALES path spills above (kernels/decode.py)


def folds_scales(kv_format: str, block_m: int, fold_scales: bool = True) -> bool:
    """Whether the decode kernel folds fp8_ds_mla scales into the float32 scores and P for a
    program of ``block_m`` rows (pow2(s_q) · heads per block) — the kernel's FOLD rule."""
    return kv_format == "fp8_ds_mla" and block_m <= FOLD_MAX_ROWS and fold_scales


def slots_ahead(num_stages: int, tma: bool, lookahead: int = 1) -> int:
    """How many tiles ahead the decode kernel's gathered loop looks up slots — its CARRY: 0
    below 3 stages (at 2, carrying measured slower) and for a TMA plan (its gathered loop is
    one partial tile); else ``lookahead`` (`DecodeConfig.lookahead`: 1, or 2 — entries
    loaded two tiles ahead). From 3 stages the carried rows get two shared buffers."""
    return lookahead if num_stages >= 3 and not tma else 0


def _tma_pays(kv_format: str, block_m: int) -> bool:
    """Whole tiles by TMA where it measured faster on the H200 (B=64 × 8K unless noted;
    h200-20261129-s6-decode-variants-*.json): fp8 16 heads 163 → 139 µs, 128 heads 702 → 611,
    B=1 × 128K 57.6 → 46.9; fp8_ds_mla at 64 rows 746 → 588. Slower where the kernel then
    spills: fp8_ds_mla with folded scales (≤ 16 rows: 196 → 222 µs, 56 spilled registers) and
    bf16 at 16 rows (its tiles are twice the bytes: 172 → 380 µs, one program per SM).
    `decode_config` overrides it for 32-row FP8 programs on SM90 (128-token tiles, gathered)
    and 64-row bf16 ones there (64-token tiles by TMA: one program an SM either way)."""
    return kv_format == "fp8" or (kv_format == "fp8_ds_mla" and not folds_scales(kv_format,
                                                                                  block_m))


def decode_config(cc: int, kv_format: str, num_heads: int, s_q: int,
                  sparse: bool = False) -> DecodeConfig:
    """The configuration the launcher picks for a target (also what the portability test
    compiles), dense or sparse (index lists). BLOCK_M = pow2(s_q) · heads_per_block rows is
    kept in [16, max]: 16 is the smallest MMA tile; at 64 four [64, 128] fp32 accumulators
    need 8 warps."""
    s_q_p2 = _pow2(s_q)
    max_m = _max_block_m(cc)
    heads = min(max(_pow2(num_heads), max(1, 16 // s_q_p2)), max(1, max_m // s_q_p2))
    block_m = s_q_p2 * heads
    fp8 = kv_format != "bf16"
    # 32-row FP8 programs (s_q 2 × 16 heads, 32 heads × s_q 1): 128 gathered tokens × 8 warps
    # instead of 32 tokens × 4 warps by TMA (H200, B=64 ctx 8K, h200-20261201-s11-*-decode-
    # variants.json): fp8 s_q 2 192.2 → 169.7 µs, 32 heads 189.9 → 169.5, B=1 × 128K × 32
    # heads 64.7 → 58.9; fp8_ds_mla s_q 2 311.8 → 252.5. Offline sm_90: 106 → 83
    # warp-instructions per token (fp8), and 192 / 213 KB of shared memory (SM90 only). Not by
    # TMA: those compiles spill 160 / 928 B per thread (gathered: 8 / 24). 64 tokens × 8 warps
    # measured between (fp8 slower, fp8_ds_mla 270 µs); bf16 32-row programs ±7%: unchanged
    wide = cc == 90 and fp8 and not sparse and block_m == 32
    # 64-row bf16 programs on SM90 (128 heads): 64-token tiles copied whole by TMA, 2 deep
    # (221 KB; one program an SM, as the 32 gathered tokens at 3 stages it replaces: 184 KB),
    # gathered at 2 stages where pages are shorter. H200, B=64 ctx 8K, µs, triton 3.6 / 3.8 /
    # 3.9 (h200-20261205-s42-8f7c82f-triton3*-decode-variants.json): s_q 1 646 → 566 / 647 →
    # 549 / 810 → 722, gathered 582 / 574 / 745; s_q 2 1287 → 1067 / 1293 → 1073 / 1800 →
    # 1378, gathered 1105 / 1112 / 1371. Offline sm_90 (3.6): 15 loop instructions a token
    # against 25; both forms spill (the TMA one ~100 B, the gathered ≤ 4), faster all the same
    bf16_64 = cc == 90 and not fp8 and not sparse and block_m == 64
    num_warps = 8 if block_m >= 64 or wide else 4
    # block_n / words_2d: the best of the H200 sweeps in benchmarks/results (B=64 ctx=8K, 4
    # splits: fp8 H16 180 us with 64 vs 188 with 32; bf16 175 vs 224; H128 fp8 707 vs 1338 at
    # 64 heads per program). 64 heads × 64 tokens needs 184 KB of shared memory: SM90 only.
    if wide:
        block_n = 128
    else:
        block_n = 64 if block_m <= 16 or (fp8 and block_m == 64 and cc == 90) or bf16_64 else 32
    # gathered tiles at 3 stages carry the next tile's slots (two shared buffers for the rows,
    # `_mla_decode_kernel`'s CARRY); H200, B=64 (h200-20261130-s8-carry-*.json): dense ctx 8K
    # H16 fp8_ds_mla 195 → 176 µs, bf16 172 → 163, fp8 without TMA 163 → 147; sparse topk 2048
    # H64 215 → 209, H128 559 → 543, but H8 68.0 → 69.8 (2 stages there). SM90 only: measured
    # there (sparse 64 rows needs 231 KB of its shared memory at 3 stages); other targets keep
    # the 2 stages they had, untimed
    num_stages = 3 if cc == 90 and (not sparse or s_q_p2 * heads >= 64) and not bf16_64 else 2
    # entries two tiles ahead: bf16 at 16 rows (H200, B=64 ctx 8K H16: 165.2 → 159.7 µs, and
    # 163.1 → 157.2 in another call: h200-20261130-s9-*); slower wherever the kernel then
    # spills more — fp8_ds_mla H16 170 → 223, sparse H64 131 → 146, sparse H8 forced to 3
    # stages 65 → 80 — and no change at 64 rows (bf16 H128 649, sparse H128 398). Only where
    # slots are carried at all (3 stages)
    lookahead = 2 if (kv_format == "bf16" and block_m <= 16 and not sparse
                      and num_stages >= 3) else 1
    # lazy rescale + late row sums (`DecodeConfig.lazy_rescale` / `late_sum`): dense FP8 at ≤ 32
    # rows on SM90, where both together measured faster (H200, h200-20261130-s10-lazy-*.json;
    # B=64 ctx 8K): fp8 H16 135.3 → 131.2 µs, fp8_ds_mla H16 171.0 → 167.8, fp8 s_q 2 222.4 →
    # 213.6, B=1 128K fp8 46.1 → 45.9, fp8_ds_mla 58.6 → 57.2. Not bf16 (±1%), not sparse (H8
    # 66.0 → 70.0) and not 64 rows (wgmma: 120–700 B more spills, offline); other targets
    # untimed
    lazy = cc == 90 and fp8 and not sparse and block_m <= 32
    return DecodeConfig(block_n=block_n, heads_per_block=heads, num_warps=num_warps,
                        num_stages=num_stages, words_2d=kv_format == "fp8",
                        tma=cc >= 90 and (_tma_pays(kv_format, block_m) or bf16_64) and not wide,
                        tma_stages=2 if bf16_64 else 3, lookahead=lookahead,
                        lazy_rescale=lazy, late_sum=lazy)


def block_shared_limit(cc: int) -> int:
    """Shared memory one program (thread block) may use on a target, bytes: the opt-in maximum,
    the SM's less the 1 KB reserved per block (SM80 163 KB, SM90 / SM100 227 KB, SM86 / SM89 /
    SM120 99 KB)."""
    return _SM_SHARED.get(cc, 102400) - 1024


def smaller_configs(cfg: DecodeConfig, tma: bool) -> Iterator[DecodeConfig]:
    """``cfg``, then the configurations to fall back on when its compile needs more shared
    memory than the target has, roughly fastest first: the tile as it is with fewer ring
    stages (down to 2; ``tma``: the stages of whole tiles copied by TMA, else those of gathered
    tiles), then half the tile's tokens at the stages it had, and so on down to 16 tokens.
    (What a compile stages through shared memory is the Triton version's choice: triton 3.8
    keeps the fp8 tiles' converted operands there, ~1.9× the shared memory of 3.6 and 3.9 — the
    8-head fp8 decode on sm_120 143 KB against 74 KB, the 32-row one on sm_90 248 KB.)"""
    stages = cfg.tma_stages if tma else cfg.num_stages
    block_n = cfg.block_n
    while block_n >= 16:
        for n in range(stages, 1, -1):
            yield (replace(cfg, block_n=block_n, tma_stages=n) if tma
                   else replace(cfg, block_n=block_n, num_stages=n,
                                lookahead=cfg.lookahead if n == stages else 1))
        block_n //= 2


def fit_shared(cfg: DecodeConfig, tma: bool, compile_fn: Callable, limit: int, *,
               fixed: bool = False, spills: Callable | None = None):
    """``cfg`` with its compile where that needs at most ``limit`` bytes of shared memory, else
    the first smaller config of `smaller_configs` that fits and does not spill (``spills``:
    compiled → whether it keeps registers in local memory; None, or an answer of None: not
    known, taken as no), else the first that fits: (config, compiled). tma: whether the compile
    copies whole tiles by TMA; compile_fn: config → a compiled kernel (``.metadata.shared``).
    fixed: ``cfg`` was asked for by name (a tuning hook), so it is taken as it is or refused
    with a ValueError, never changed. (Spills matter only past the tuned config: triton 3.8's
    32-row fp8 config at 2 stages on sm_90 spills 224 B a thread; half its tile at 3 stages
    fits without spilling — though on the H200 that ran as slowly, 308 µs against 3.6's 169:
    3.8 stages converted FP8 operands through shared memory, spills or not; BENCHMARKS.md,
    session 42.)"""
    need, fitting = None, None
    for i, candidate in enumerate([cfg] if fixed else smaller_configs(cfg, tma)):
        kernel = compile_fn(candidate)
        need = kernel.metadata.shared
        if need > limit:
            continue
        if i == 0 or spills is None or not spills(kernel):
            return candidate, kernel
        fitting = fitting or (candidate, kernel)
    if fitting is not None:
        return fitting
    what = "config" if fixed else "decode kernel: even the smallest configuration"
    raise ValueError(f"{what}: its compile needs {need} B of shared memory, this GPU allows "
                     f"{limit} B a program ({candidate})")
