"""KV-cache formats: byte layouts and PyTorch reference quantize / dequantize (docs/DESIGN.md §3).

Every cache row is stored as raw bytes (``uint8``); a format says how to read them.
The latent part (``kv_lora_rank`` = 512 values) and the RoPE part (64 values) form one
576-value row ``[c_kv | k_rope]``.

``bf16`` (1152 bytes)
    576 × bfloat16, little-endian: latent at bytes [0, 1024), rope at [1024, 1152).
``fp8`` (576 bytes)
    576 × float8_e4m3fn; one float32 scale per tensor (per layer), kept beside the pool.
    value = e4m3(byte) × scale.
``fp8_ds_mla`` (656 bytes; byte-compatible with FlashMLA's sparse FP8 cache and vLLM's
``fp8_ds_mla``)
    bytes [0, 512): 512 × e4m3 latent; [512, 528): 4 × float32 scales, scale t for latent
    values [128 t, 128 t + 128); [528, 656): 64 × bfloat16 rope (not quantized).
    Scale policy ``pow2``: scale = 2^ceil(log2(amax / 448)) (DeepSeek / FlashMLA, "ue8m0");
    ``fp32``: scale = amax / 448 (GLM's "arbitrary_fp32"). amax is clamped below at 1e-4 so an
    all-zero tile gets a finite scale (FlashMLA's own test quantizer would divide by zero).
Index keys (132 bytes per token; DeepGEMM's paged ``fp8_paged_mqa_logits`` cache)
    per page: page_size × 128 e4m3 bytes, then page_size × float32 scales (one per token).
    scale = amax / 448 per token (``fp32``) or its power-of-two ceiling (``pow2``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "LATENT_DIM", "ROPE_DIM", "KV_DIM", "FP8_MAX", "INDEX_HEAD_DIM", "INDEX_ROW_BYTES",
    "KVFormat", "KV_FORMATS", "SCALE_POLICIES", "kv_format", "compute_scale",
    "quantize_kv", "dequantize_kv", "quantize_index_keys", "dequantize_index_keys",
]

LATENT_DIM = 512
ROPE_DIM = 64
KV_DIM = LATENT_DIM + ROPE_DIM
FP8_MAX = 448.0
TILE = 128  # latent values per fp8_ds_mla scale
AMAX_FLOOR = 1e-4
INDEX_HEAD_DIM = 128
INDEX_ROW_BYTES = INDEX_HEAD_DIM + 4
SCALE_POLICIES = ("pow2", "fp32")


@dataclass(frozen=True)
class KVFormat:
    """A latent-cache row format. ``scale_policy`` applies to ``fp8_ds_mla`` only."""

    name: str
    row_bytes: int
    scale_policy: str | None = None

    @property
    def is_fp8(self) -> bool:
        return self.name != "bf16"

    def __str__(self) -> str:
        return self.name if self.scale_policy is None else f"{self.name}[{self.scale_policy}]"


KV_FORMATS = {"bf16": 2 * KV_DIM, "fp8": KV_DIM, "fp8_ds_mla": LATENT_DIM + 4 * 4 + 2 * ROPE_DIM}


def kv_format(name: str | KVFormat, scale_policy: str | None = None) -> KVFormat:
    """The `KVFormat` called ``name`` (``bf16``, ``fp8``, ``fp8_ds_mla``).

    ``scale_policy`` (``pow2`` default, or ``fp32``) is only meaningful for ``fp8_ds_mla``.
    """
    if isinstance(name, KVFormat):
        if scale_policy is not None and scale_policy != name.scale_policy:
            name = kv_format(name.name, scale_policy)
        return name
    if name not in KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {', '.join(KV_FORMATS)}, got {name!r}")
    if name == "fp8_ds_mla":
        policy = scale_policy or "pow2"
        if policy not in SCALE_POLICIES:
            raise ValueError(
                f"scale_policy: expected one of {', '.join(SCALE_POLICIES)}, got {policy!r}"
            )
        return KVFormat(name, KV_FORMATS[name], policy)
    if scale_policy is not None:
        raise ValueError(f"scale_policy: only fp8_ds_mla takes one, got {scale_policy!r} for {name}")
    return KVFormat(name, KV_FORMATS[name])


def compute_scale(amax: torch.Tensor, policy: str) -> torch.Tensor:
    """float32 dequantization scales, the shape of ``amax`` (any float dtype, any shape: each
    element a block's absolute maximum), under ``policy`` ("pow2" or "fp32")."""
    amax = amax.float().clamp_min(AMAX_FLOOR)
    # a tensor divisor: PyTorch's CUDA kernels multiply by the reciprocal of a scalar one,
    # which can differ from the IEEE quotient (what the store kernels compute) by an ulp
    scale = amax / torch.full_like(amax, FP8_MAX)
    if policy == "pow2":
        # ceil to a power of two on the bits (exact; a log2 can round across the power)
        bits = scale.contiguous().view(torch.int32)
        scale = ((bits + 0x7FFFFF) & 0x7F800000).view(torch.float32)
    elif policy != "fp32":
        raise ValueError(f"scale_policy: expected one of {', '.join(SCALE_POLICIES)}, got {policy!r}")
    return scale


def _to_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    # Round to nearest even, saturating at ±448 (as the store kernels do).
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _e4m3_bytes_to_float(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float8_e4m3fn).float()


def _check_rows(latent: torch.Tensor, rope: torch.Tensor) -> None:
    if latent.dim() != 2 or latent.shape[1] != LATENT_DIM:
        raise ValueError(f"latent: expected shape [tokens, {LATENT_DIM}], got {list(latent.shape)}")
    if rope.dim() != 2 or rope.shape[1] != ROPE_DIM or rope.shape[0] != latent.shape[0]:
        raise ValueError(
            f"rope: expected shape [{latent.shape[0]}, {ROPE_DIM}], got {list(rope.shape)}"
        )


def quantize_kv(
    latent: torch.Tensor, rope: torch.Tensor, fmt: str | KVFormat, scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Reference encoder: rows of ``fmt`` bytes.

    latent: [tokens, 512], rope: [tokens, 64], any float dtype (rounded to bf16 first, as a
    server's cache writes receive bf16). scale: the per-tensor scale of ``fp8``, a float or a
    float32 [1] tensor (ignored otherwise). Returns uint8 [tokens, fmt.row_bytes].
    """
    fmt = kv_format(fmt)
    _check_rows(latent, rope)
    latent = latent.to(torch.bfloat16).float()
    rope = rope.to(torch.bfloat16)
    n = latent.shape[0]
    out = torch.empty(n, fmt.row_bytes, dtype=torch.uint8, device=latent.device)
    if fmt.name == "bf16":
        out.view(torch.bfloat16)[:, :LATENT_DIM] = latent.to(torch.bfloat16)
        out.view(torch.bfloat16)[:, LATENT_DIM:] = rope
    elif fmt.name == "fp8":
        s = torch.as_tensor(scale, dtype=torch.float32, device=latent.device)
        out[:] = _to_e4m3_bytes(torch.cat([latent, rope.float()], dim=1) / s)
    else:
        tiles = latent.view(n, LATENT_DIM // TILE, TILE)
        scales = compute_scale(tiles.abs().amax(dim=2), fmt.scale_policy)
        out[:, :LATENT_DIM] = _to_e4m3_bytes(tiles / scales[:, :, None]).view(n, LATENT_DIM)
        out[:, LATENT_DIM:LATENT_DIM + 16] = scales.contiguous().view(torch.uint8)
        out[:, LATENT_DIM + 16:] = rope.contiguous().view(torch.uint8)
    return out


def dequantize_kv(
    rows: torch.Tensor, fmt: str | KVFormat, scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Reference decoder. rows: uint8 [..., fmt.row_bytes] → float32 [..., 576]; scale: the
    per-tensor scale of ``fp8``, a float or a float32 [1] tensor (ignored otherwise)."""
    fmt = kv_format(fmt)
    if rows.dtype != torch.uint8 or rows.shape[-1] != fmt.row_bytes:
        raise ValueError(
            f"rows: expected uint8 [..., {fmt.row_bytes}] for {fmt.name}, "
            f"got {rows.dtype} {list(rows.shape)}"
        )
    lead = rows.shape[:-1]
    rows = rows.reshape(-1, fmt.row_bytes).contiguous()
    if fmt.name == "bf16":
        out = rows.view(torch.bfloat16).float()
    elif fmt.name == "fp8":
        out = _e4m3_bytes_to_float(rows) * torch.as_tensor(scale, dtype=torch.float32,
                                                           device=rows.device)
    else:
        n = rows.shape[0]
        lat = _e4m3_bytes_to_float(rows[:, :LATENT_DIM]).view(n, LATENT_DIM // TILE, TILE)
        scales = rows[:, LATENT_DIM:LATENT_DIM + 16].contiguous().view(torch.float32)
        rope = rows[:, LATENT_DIM + 16:].contiguous().view(torch.bfloat16).float()
        out = torch.cat([(lat * scales[:, :, None]).view(n, LATENT_DIM), rope], dim=1)
    return out.view(*lead, KV_DIM)


def quantize_index_keys(keys: torch.Tensor, policy: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference indexer-key encoder. keys: [tokens, 128] float → (uint8 [tokens, 128] e4m3
    bytes, float32 [tokens] scales)."""
    if keys.dim() != 2 or keys.shape[1] != INDEX_HEAD_DIM:
        raise ValueError(f"keys: expected shape [tokens, {INDEX_HEAD_DIM}], got {list(keys.shape)}")
    k = keys.to(torch.bfloat16).float()
    scales = compute_scale(k.abs().amax(dim=1), policy)
    return _to_e4m3_bytes(k / scales[:, None]), scales


def dequantize_index_keys(fp8_bytes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Reference indexer-key decoder: (uint8 [tokens, 128], float32 [tokens]) → float32
    [tokens, 128]."""
    return _e4m3_bytes_to_float(fp8_bytes) * scales.float()[..., None]
