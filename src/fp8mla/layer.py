"""`DSAAttention`: the attention block of GLM-5 / DeepSeek-V3.2 (and dense MLA of DeepSeek-V3)
over fp8mla's paged caches, with Hugging Face weights.

Per layer, for new tokens x at absolute positions p (docs/DESIGN.md §2):
  q_resid = RMSNorm(q_a_proj x);  [q_nope | q_rot] = q_b_proj q_resid           (per head)
  [c | k_rot] = kv_a_proj_with_mqa x;  c = RMSNorm(c)                             (shared latent)
  RoPE on q_rot, k_rot (interleaved pairs, laid out as transformers does: rotated even dims, then
  rotated odd dims — q and k alike, so dot products are those of the interleaved math)
  absorbed query [q_nope · W_UK | q_rot] (576) against cache rows [c | k_rot]; latent output
  o_lat (512) → o = o_lat · W_UV per head → o_proj.
  DSA: the lightning indexer scores every visible past token, top-k (index_topk) of them are
  attended. Index q is quantized to FP8 per (token, head) with its scale folded into the weights;
  index keys are stored FP8 (132-byte layout).

Decode runs the projections of x as one GEMM and those of q_resid as another, with W_UK
absorbed into q_b_proj's rows on the fp8mla backend (`DSAAttention._fused`); the per-step
tensors every layer needs (RoPE angles, slots, lengths) come from one `StepInputs`.

`backend="fp8mla"` runs fp8mla's kernels; `backend="reference"` runs the float32 oracles on the
same caches (the independent check). ``attn_mode`` switches the attention's cache read to the
motivating deployment's baselines (``full_cast``: the whole FP8 pool cast to BF16 each call;
``gather_cast``: the listed rows gathered, then cast) for the demo's comparison. Accuracy
against transformers (tests/test_layer.py): bf16 cache within 1e-2 relative error, fp8_ds_mla
within 4e-2 (measured 0.5% and 2.6%). DeepSeek-V3.2's indexer applies an orthonormal Hadamard
transform to q_I and k_I before FP8 quantization (dot products unchanged).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import torch
import triton
from torch import nn

from fp8mla import reference
from fp8mla._checks import check_page_size, check_tensor
from fp8mla._plans import PlanCache
from fp8mla.baselines import cast_rows_to_bf16
from fp8mla.cache import IndexKeyCache, PagedKVCache
from fp8mla.config import MLAConfig
from fp8mla.decode import DecodePlan
from fp8mla.formats import INDEX_HEAD_DIM, KV_DIM, LATENT_DIM, ROPE_DIM
from fp8mla.indexer import indexer_logits_paged, indexer_logits_ragged
from fp8mla.kernels.launch import fast
from fp8mla.kernels.rope import _rope_kernel
from fp8mla.kernels.rows import _quant_rows_kernel, _rms_norm_kernel
from fp8mla.prefill import dense_prefill, row_chunks, visible_slots
from fp8mla.sparse import SparsePlan
from fp8mla.topk import topk_indices

__all__ = ["DSAAttention", "StepInputs", "rope_cos_sin", "apply_rope", "rope_rows"]

BACKENDS = ("fp8mla", "reference")
ATTN_MODES = ("native", "gather_cast", "full_cast")


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


@functools.lru_cache(maxsize=64)
def _inv_freq(cfg: MLAConfig, device: torch.device) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies of the 64 rope dims and the factor cos/sin are scaled by.
    YaRN (DeepSeek-V3 / V3.2 / Kimi-K2): frequencies blend interpolation (÷ factor) and
    extrapolation along a linear ramp between the dims where beta_fast and beta_slow rotations
    fit the original context (arXiv 2309.00071; the form transformers implements). Cached per
    (config, device): every layer of every step reuses one tensor (read-only)."""
    exps = torch.arange(0, ROPE_DIM, 2, dtype=torch.float32, device=device) / ROPE_DIM
    extrapolated = 1.0 / (cfg.rope_theta ** exps)
    if cfg.yarn_factor <= 1.0:
        return extrapolated, 1.0

    def dim_of(rotations: float) -> float:
        return (ROPE_DIM * math.log(cfg.yarn_original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(cfg.rope_theta)))

    low, high = dim_of(cfg.yarn_beta_fast), dim_of(cfg.yarn_beta_slow)
    if cfg.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, ROPE_DIM - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(ROPE_DIM // 2, dtype=torch.float32, device=device) - low)
            / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # weight of the extrapolated (original) frequency
    inv = extrapolated / cfg.yarn_factor * (1.0 - keep) + extrapolated * keep
    if cfg.yarn_rope_mscale and cfg.yarn_mscale_all_dim:
        attention = (_yarn_mscale(cfg.yarn_factor, cfg.yarn_rope_mscale)
                     / _yarn_mscale(cfg.yarn_factor, cfg.yarn_mscale_all_dim))
    else:
        attention = _yarn_mscale(cfg.yarn_factor)
    return inv, attention


def _hadamard(n: int, device) -> torch.Tensor:
    """The n × n Sylvester Hadamard matrix scaled to be orthonormal (n a power of two)."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def rope_cos_sin(positions: torch.Tensor, cfg: MLAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin, float32 [..., 32], for the 64 RoPE dims (one angle per dim pair) of tokens at
    ``positions`` (int32 / int64 [...]), YaRN included."""
    inv, attention = _inv_freq(cfg, positions.device)
    ang = positions.float()[..., None] * inv
    if attention == 1.0:
        return ang.cos(), ang.sin()
    return ang.cos() * attention, ang.sin() * attention


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate the last dim (64) of x (any float dtype) [..., n, 64] by angles cos / sin
    (float32 [..., 32], broadcast over n); returns [..., n, 64] in the promoted dtype.
    interleave: pairs (2i, 2i+1), output [rotated evens | rotated odds] (transformers' layout);
    otherwise pairs (i, i+32) (rotate-half)."""
    c, s = cos[..., None, :], sin[..., None, :]
    if interleave:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :32], x[..., 32:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def rope_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool,
              out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`apply_rope` fused into one kernel, which also copies the rest of the row: x bf16 / fp16
    / float32 [..., n, D] (D = 64, or 128 with the rope dims first — the indexer's q and k;
    last dim contiguous), cos / sin float32 [..., 32] per token. Returns out_dtype (float32
    or bfloat16, computed in float32 and rounded to nearest even) [..., n, D]."""
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype: expected torch.float32 or torch.bfloat16, got {out_dtype}")
    check_tensor("x", x, contiguous_last=True)
    if x.dim() < 2 or x.shape[-1] not in (ROPE_DIM, INDEX_HEAD_DIM):
        raise ValueError(f"x: expected [..., n, {ROPE_DIM}] or [..., n, {INDEX_HEAD_DIM}], got "
                         f"{list(x.shape)}")
    *lead, n, d = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, dtype=torch.float32, shape=(*lead, ROPE_DIM // 2),
                     device=x.device)
    rows = x.reshape(-1, d)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    if rows.shape[0]:
        block_r = 16
        fast(_rope_kernel)[(triton.cdiv(rows.shape[0], block_r),)](
            rows, out, cos.reshape(-1, 32).contiguous(), sin.reshape(-1, 32).contiguous(),
            rows.shape[0], rows.stride(0), out.stride(0), ROWS_PER_TOKEN=n, D=d,
            INTERLEAVE=interleave, BLOCK_R=block_r)
    return out.view(*lead, n, d)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`_rms_norm` (transformers' form, roundings included) in one kernel. x [..., n] (last
    dim contiguous) and weight [n] of one dtype; returns [..., n] in that dtype."""
    if x.dtype != weight.dtype:
        return _rms_norm(x, weight, eps)
    check_tensor("x", x, contiguous_last=True)
    n = x.shape[-1]
    check_tensor("weight", weight, shape=(n,), contiguous_last=True)
    rows = x.reshape(-1, n)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        fast(_rms_norm_kernel)[(rows.shape[0],)](
            rows, weight, out, rows.stride(0), out.stride(0), n, eps,
            BLOCK=triton.next_power_of_2(n), num_warps=4 if n <= 2048 else 8)
    return out.view(x.shape)


def quantize_rows_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row FP8: x [..., D] (D a power of two) → (e4m3 [..., D], float32 scale [...]) with
    scale = max(amax, 1e-4) / 448 — the indexer's q_I, in one kernel."""
    check_tensor("x", x, contiguous_last=True)
    d = x.shape[-1] if x.dim() else 0
    if d < 1 or d & (d - 1):
        raise ValueError(f"x: expected a power-of-two last dimension, got shape {list(x.shape)}")
    rows = x.reshape(-1, d)
    q = torch.empty(rows.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        block_r = 8
        fast(_quant_rows_kernel)[(triton.cdiv(rows.shape[0], block_r),)](
            rows, q, scale, rows.shape[0], rows.stride(0), q.stride(0), DIM=d, BLOCK_R=block_r)
    return q.view(torch.float8_e4m3fn).view(x.shape), scale.view(x.shape[:-1])


_SPARSE_PLANS = PlanCache()
_DECODE_PLANS = PlanCache()


def _sparse_plan(queries: int, heads: int, topk: int, fmt, softmax_scale: float,
                 device: torch.device, plans: PlanCache | None = None) -> SparsePlan:
    """The sparse plan of this shape in ``plans`` (default: the process's shared ones); its
    runs are given their outputs (the plan holds none)."""
    key = (queries, heads, topk, getattr(fmt, "name", fmt), softmax_scale, str(device))
    return (_SPARSE_PLANS if plans is None else plans).get(key, lambda: SparsePlan(
        num_queries=queries, num_heads=heads, topk=topk, kv_format=fmt,
        softmax_scale=softmax_scale, device=device, own_outputs=False))


def _decode_plan(batch: int, heads: int, s_q: int, fmt, page_size: int, max_seqlen: int,
                 softmax_scale: float, device: torch.device) -> DecodePlan:
    """The shared dense decode plan of this shape (`PlanCache`), sized for ``max_seqlen`` (the
    block table's span, so no step reads its lengths on the host); its runs are given their
    outputs."""
    key = (batch, heads, s_q, fmt.name, page_size, max_seqlen, softmax_scale, str(device))
    return _DECODE_PLANS.get(key, lambda: DecodePlan(
        batch=batch, num_heads=heads, s_q=s_q, kv_format=fmt, page_size=page_size,
        max_seqlen=max_seqlen, softmax_scale=softmax_scale, device=device, own_outputs=False))


@dataclass(frozen=True)
class StepInputs:
    """What every layer of a step derives from the new tokens' positions and the block table,
    computed once per step (`DSAAttention.step_inputs`) instead of in each layer (~15 small
    kernels per layer at B=1). All layers of one model share it: same config, same page size.

    positions: int32 / int64 [B, S] and block_table: int32 [B, max_pages], as given to
    `step_inputs`; cos / sin: float32 [B, S, 32] RoPE; slots: int64 [B, S] cache slots of the
    new tokens;
    lengths: int32 [B] request lengths after the step; visible: int32 [B·S] tokens each new
    token sees (position + 1).
    """

    cfg: MLAConfig
    positions: torch.Tensor
    block_table: torch.Tensor
    page_size: int
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    lengths: torch.Tensor
    visible: torch.Tensor


class DSAAttention(nn.Module):
    """One MLA / DSA attention layer.

    Args:
        config: the per-rank `MLAConfig` (split_tp applied); kv_lora_rank 512, rope 64 and
            index_head_dim 128 are what the kernels take.
        backend: ``fp8mla`` (kernels) or ``reference`` (float32 oracles).
        rms_norm_eps: the model's RMSNorm epsilon (GLM-5: 1e-5, DeepSeek: 1e-6).
    Weights are created uninitialised; load them with `load_hf_state_dict` / `from_hf`.
    Inference only (the kernels have no backward). The decode path stacks projections that
    share an input into one weight (`_fused`); after writing weights through ``.data`` call
    `refresh_weights`.
    """

    def __init__(self, config: MLAConfig, *, backend: str = "fp8mla", rms_norm_eps: float = 1e-6,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        if config.kv_lora_rank != LATENT_DIM or config.qk_rope_head_dim != ROPE_DIM:
            raise ValueError(f"config: kernels take kv_lora_rank {LATENT_DIM} and rope "
                             f"{ROPE_DIM}, got {config.kv_lora_rank} / {config.qk_rope_head_dim}")
        if config.is_sparse and config.index_head_dim != INDEX_HEAD_DIM:
            raise ValueError(f"config: index_head_dim must be {INDEX_HEAD_DIM}, got "
                             f"{config.index_head_dim}")
        self.cfg, self.backend, self.eps = config, backend, rms_norm_eps
        self.attn_mode = "native"  # or a baseline: "gather_cast", "full_cast" (fp8 caches)
        h, nope, v = config.num_heads, config.qk_nope_head_dim, config.v_head_dim
        kw = dict(dtype=dtype, device=device)
        self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False, **kw)
        self.q_a_layernorm = nn.Parameter(torch.ones(config.q_lora_rank, **kw))
        self.q_b_proj = nn.Linear(config.q_lora_rank, h * (nope + ROPE_DIM), bias=False, **kw)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, LATENT_DIM + ROPE_DIM,
                                            bias=False, **kw)
        self.kv_a_layernorm = nn.Parameter(torch.ones(LATENT_DIM, **kw))
        self.kv_b_proj = nn.Linear(LATENT_DIM, h * (nope + v), bias=False, **kw)
        self.o_proj = nn.Linear(h * v, config.hidden_size, bias=False, **kw)
        if config.is_sparse:
            hi = config.index_n_heads
            self.wq_b = nn.Linear(config.q_lora_rank, hi * INDEX_HEAD_DIM, bias=False, **kw)
            self.wk = nn.Linear(config.hidden_size, INDEX_HEAD_DIM, bias=False, **kw)
            self.k_norm = nn.LayerNorm(INDEX_HEAD_DIM, eps=1e-6, **kw)
            self.weights_proj = nn.Linear(config.hidden_size, hi, bias=False, **kw)
        self._fused_weights: dict[str, tuple] = {}

    def refresh_weights(self) -> None:
        """Drop the fused / absorbed projection weights so the next call rebuilds them: needed
        only after writing weights through ``.data`` (PyTorch does not version those writes);
        loads, ``copy_`` and replaced parameters are noticed by themselves."""
        self._fused_weights.clear()

    @staticmethod
    def _fusable(mods: list[nn.Linear]) -> bool:
        w = mods[0].weight
        return all(m.weight.dtype == w.dtype and m.weight.device == w.device for m in mods)

    def _fused(self, name: str, mods: list[nn.Linear], build=None) -> tuple[torch.Tensor,
                                                                             list[int]]:
        """One weight [Σ rows, in] for projections that read the same input (same dtype and
        device: `_fusable`), so a decode step streams them in one GEMM instead of one small
        launch each: by default the ``mods`` weights stacked, which then become views into it
        (no second copy); ``build()`` → (rows to stack, their sizes) for weights derived from
        ``mods`` (a second copy). Rebuilt when one of the weights was replaced (``.to()``, a new
        Parameter) or written in place (a state-dict load or ``copy_`` bumps its version);
        writes through ``.data`` need `refresh_weights`. Inference only: no gradient reaches
        the layers' weights through it."""
        def state():
            return [(m.weight, m.weight.data_ptr(), m.weight._version) for m in mods]

        def same(a, b):
            return len(a) == len(b) and all(x[0] is y[0] and x[1:] == y[1:]
                                            for x, y in zip(a, b, strict=True))

        cached = self._fused_weights.get(name)
        if cached is None or not same(cached[0], state()):
            with torch.no_grad():
                if build is None:
                    sizes = [m.out_features for m in mods]
                    fused = torch.cat([m.weight.detach() for m in mods])
                    for m, lo in zip(mods, itertools.accumulate([0] + sizes[:-1]), strict=True):
                        m.weight.data = fused[lo:lo + m.out_features]
                else:
                    parts, sizes = build()
                    fused = torch.cat(parts)
            cached = self._fused_weights[name] = (state(), fused, sizes)
        return cached[1], cached[2]

    def _absorbed_q_rows(self) -> tuple[list[torch.Tensor], list[int]]:
        """Rows of the q_resid GEMM with W_UK absorbed: per head W_UKᵀ·W_q_nope [512, q_lora]
        (computed in float32, rounded once), then the rope rows of q_b_proj, then the indexer's
        wq_b. q_lat then comes out of the GEMM directly, not from a per-head batched matmul of
        one row (measured on the H200 at GLM-5 TP8, B=1: the matmul and its split-K reduction
        4.6 µs, the larger GEMM +3.6 µs). Costs a second copy of q_b_proj's and wq_b's
        weights plus h·512·q_lora absorbed rows."""
        cfg = self.cfg
        h, nope = cfg.num_heads, cfg.qk_nope_head_dim
        w_q = self.q_b_proj.weight.detach().view(h, nope + ROPE_DIM, -1)
        w_uk = self.kv_b_proj.weight.detach().view(h, nope + cfg.v_head_dim, LATENT_DIM)[:, :nope]
        absorbed = torch.einsum("hnr,hnq->hrq", w_uk.float(), w_q[:, :nope].float())
        parts = [absorbed.to(w_q.dtype).reshape(h * LATENT_DIM, -1),
                 w_q[:, nope:].reshape(h * ROPE_DIM, -1)]
        if cfg.is_sparse:
            parts.append(self.wq_b.weight.detach())
        return parts, [p.shape[0] for p in parts]

    # --- weights ---------------------------------------------------------------------------
    _HF_KEYS = {
        "q_a_proj.weight": "q_a_proj.weight", "q_a_layernorm.weight": "q_a_layernorm",
        "q_b_proj.weight": "q_b_proj.weight",
        "kv_a_proj_with_mqa.weight": "kv_a_proj_with_mqa.weight",
        "kv_a_layernorm.weight": "kv_a_layernorm", "kv_b_proj.weight": "kv_b_proj.weight",
        "o_proj.weight": "o_proj.weight",
    }
    _HF_INDEXER_KEYS = {
        "indexer.wq_b.weight": "wq_b.weight", "indexer.wk.weight": "wk.weight",
        "indexer.k_norm.weight": "k_norm.weight", "indexer.k_norm.bias": "k_norm.bias",
        "indexer.weights_proj.weight": "weights_proj.weight",
    }

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load transformers' GlmMoeDsaAttention / DeepseekV32Attention weights. Missing, extra
        or mis-shaped keys raise one ValueError naming each."""
        mapping = dict(self._HF_KEYS)
        if self.cfg.is_sparse:
            mapping.update(self._HF_INDEXER_KEYS)
        own = dict(self.named_parameters())
        problems = [f"missing {k}" for k in mapping if k not in state_dict]
        problems += [f"unexpected {k}" for k in state_dict if k not in mapping]
        for k, name in mapping.items():
            if k in state_dict and tuple(state_dict[k].shape) != tuple(own[name].shape):
                problems.append(f"{k}: expected shape {list(own[name].shape)}, got "
                                f"{list(state_dict[k].shape)}")
        if problems:
            raise ValueError("state_dict: " + "; ".join(problems))
        with torch.no_grad():
            for k, name in mapping.items():
                own[name].copy_(state_dict[k])

    @classmethod
    def from_hf(cls, module: nn.Module, config: MLAConfig, **kwargs) -> DSAAttention:
        """A layer holding the weights of a transformers attention module."""
        layer = cls(config, **kwargs)
        layer.load_hf_state_dict({k: v for k, v in module.state_dict().items()})
        return layer

    # --- forward ---------------------------------------------------------------------------
    def step_inputs(self, positions: torch.Tensor, block_table: torch.Tensor,
                    page_size: int) -> StepInputs:
        """The per-step tensors of `StepInputs` for positions int [B, S] and block_table int32
        [B, max_pages] of a cache with ``page_size``; pass the result to every layer's
        `forward` (``step=``) with the same positions and block_table."""
        check_tensor("positions", positions, dtype=(torch.int32, torch.int64), ndim=2)
        check_tensor("block_table", block_table, dtype=torch.int32,
                     shape=(positions.shape[0], None), device=positions.device)
        check_page_size(page_size)
        cos, sin = rope_cos_sin(positions, self.cfg)
        slots = (block_table.gather(1, (positions // page_size).long()).long() * page_size
                 + positions.long() % page_size)
        visible = (positions + 1).to(torch.int32)
        # lengths: a [B] tensor of its own — the kernels read it with unit stride, and the last
        # column of [B, S] has stride S (an S ≥ 2 step's requests past the first read their
        # neighbours' lengths until session 44)
        return StepInputs(self.cfg, positions, block_table, page_size, cos, sin, slots,
                          visible[:, -1].contiguous(), visible.reshape(-1))

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, kv_cache: PagedKVCache,
                index_cache: IndexKeyCache | None, layer: int, block_table: torch.Tensor,
                topk_override: torch.Tensor | None = None, check: bool = True,
                step: StepInputs | None = None) -> torch.Tensor:
        """Attend S new tokens per request (prefill when the context is empty, decode after).

        hidden: bf16 / fp16 / float32 [B, S, hidden_size]; positions: int32 / int64 [B, S],
        absolute and consecutive per request (the request's length after this call is
        positions[:, -1] + 1); kv_cache / index_cache: the model's caches (``layer`` selects
        this layer's pools); block_table: int32 [B, max_pages] covering the new tokens.
        topk_override: int32 / int64 [B, S, k] token positions to attend instead of the
        indexer's choice (tests compare given the same set).
        check: validate cache slots on the host (off for CUDA-graph capture: a decode step of
        S <= 4 tokens then runs without host synchronisation).
        step: `step_inputs(positions, block_table, kv_cache.page_size)`, shared by the layers
        of one step (computed here when None).
        Returns [B, S, hidden_size] in hidden's dtype.
        """
        cfg = self.cfg
        check_tensor("hidden", hidden, dtype=(torch.bfloat16, torch.float16, torch.float32),
                     shape=(None, None, cfg.hidden_size))
        b, s, _ = hidden.shape
        check_tensor("positions", positions, dtype=(torch.int32, torch.int64), shape=(b, s),
                     device=hidden.device)
        check_tensor("block_table", block_table, dtype=torch.int32, shape=(b, None),
                     device=hidden.device)
        if not isinstance(kv_cache, PagedKVCache):
            raise TypeError(f"kv_cache: expected a PagedKVCache, got {type(kv_cache).__name__}")
        h, nope = cfg.num_heads, cfg.qk_nope_head_dim
        ps = kv_cache.page_size
        if check and positions.numel():  # (a host sync, as the slot checks below)
            cover = block_table.shape[1] * ps
            lo, hi = int(positions.min()), int(positions.max())
            if lo < 0 or hi >= cover:
                raise ValueError(f"positions: expected values in [0, {cover}) (the block "
                                 f"table's pages × page_size {ps}), got {lo if lo < 0 else hi}")
        if step is None:
            step = self.step_inputs(positions, block_table, ps)
        elif (step.positions is not positions or step.block_table is not block_table
              or step.page_size != ps or (step.cfg is not cfg and step.cfg != cfg)):
            raise ValueError("step: expected the StepInputs of these positions, block_table, "
                             "page size and config (build it with step_inputs), got another's")
        cos, sin, slots = step.cos, step.sin, step.slots

        norm = _rms_norm if self.backend == "reference" else rms_norm
        # the projections of hidden in one GEMM, then those of q_resid in another
        x_mods = [self.q_a_proj, self.kv_a_proj_with_mqa]
        if cfg.is_sparse:
            x_mods += [self.wk, self.weights_proj]
        if self._fusable(x_mods):
            w_x, n_x = self._fused("x", x_mods)
            q_a, ckv, *x_rest = nn.functional.linear(hidden, w_x).split(n_x, dim=-1)
        else:
            q_a, ckv, *x_rest = [m(hidden) for m in x_mods]
        k_index, w_index = x_rest if cfg.is_sparse else (None, None)
        q_resid = norm(q_a, self.q_a_layernorm, self.eps)
        # the fp8mla kernels take bf16 rope dims: RoPE rounds once, into what they read
        rope = (apply_rope if self.backend == "reference"
                else functools.partial(rope_rows, out_dtype=torch.bfloat16))
        w_kv = self.kv_b_proj.weight.view(h, nope + cfg.v_head_dim, LATENT_DIM)
        w_uk, w_uv = w_kv[:, :nope], w_kv[:, nope:]
        q_index = None
        q_mods = [self.q_b_proj, self.kv_b_proj] + ([self.wq_b] if cfg.is_sparse else [])
        if self.backend == "reference" or not self._fusable(q_mods):
            # the plain order: q_b_proj, then W_UK per head
            q = self.q_b_proj(q_resid).view(b, s, h, nope + ROPE_DIM)
            q_lat = torch.einsum("bshn,hnr->bshr", q[..., :nope], w_uk)
            q_rot = q[..., nope:]
            if cfg.is_sparse:
                q_index = self.wq_b(q_resid)
        else:  # one GEMM: [q_lat (W_UK absorbed) | q_rot | indexer q]
            w_q, n_q = self._fused("q", q_mods, build=self._absorbed_q_rows)
            q_lat, q_rot, *rest = nn.functional.linear(q_resid, w_q).split(n_q, dim=-1)
            q_lat, q_rot = q_lat.view(b, s, h, LATENT_DIM), q_rot.view(b, s, h, ROPE_DIM)
            q_index = rest[0] if rest else None
        q_rot = rope(q_rot, cos, sin, cfg.rope_interleave)
        c = norm(ckv[..., :LATENT_DIM], self.kv_a_layernorm, self.eps)
        k_rot = rope(ckv[..., None, LATENT_DIM:], cos, sin, cfg.rope_interleave)[..., 0, :]
        kv_cache.store(layer, c.reshape(-1, LATENT_DIM).to(torch.bfloat16),
                       k_rot.reshape(-1, ROPE_DIM).to(torch.bfloat16), slots.reshape(-1),
                       check=check)

        q_kernel = torch.cat([q_lat.to(torch.bfloat16), q_rot.to(torch.bfloat16)], dim=-1)

        if topk_override is None and not cfg.is_sparse:  # dense MLA: every visible token
            o_lat = self._attend_dense(q_kernel, kv_cache, layer, block_table, step)
        else:
            if topk_override is not None:  # causal: a token never sees later positions
                chosen = topk_override.to(torch.int64)
                chosen = torch.where(chosen <= positions[..., None], chosen, -1)
            else:
                chosen = self._indexer(hidden, q_resid, cos, sin, index_cache, layer, slots,
                                       block_table, positions, check, kv_page_size=ps,
                                       projected=(q_index, k_index, w_index), step=step)
            if chosen.dtype == torch.int32:  # the paged indexer's top-k emitted slots already
                idx = chosen
            else:  # positions → slots (−1 stays −1)
                pages = block_table.gather(1, (chosen.clamp_min(0) // ps).view(b, -1).long())
                idx = torch.where(chosen >= 0, pages.view_as(chosen).long() * ps + chosen % ps,
                                  -1).to(torch.int32)
            o_lat = self._attend(q_kernel.view(b * s, h, KV_DIM), kv_cache, layer,
                                 idx.view(b * s, -1))
        o = torch.einsum("bshr,hvr->bshv", o_lat.view(b, s, h, LATENT_DIM).to(w_uv.dtype), w_uv)
        return self.o_proj(o.reshape(b, s, -1).to(hidden.dtype))

    def _attend_dense(self, q, kv_cache, layer, block_table, step):
        """Dense MLA, q [B, S, heads, 576]: each new token over every token it sees. The native
        fp8mla path takes the paged decode kernel: decode steps (S ≤ 4) through a `DecodePlan`
        planned for the block table's span (no host synchronisation), prefills through
        `fp8mla.prefill.dense_prefill` (groups of tokens as decode requests, planned for the
        block table's span too). The other paths attend each query row to the index list of
        its visible tokens, built for `fp8mla.prefill.CHUNK_ENTRIES` entries at a time.
        Returns [B·S, heads, 512]."""
        b, s, h, _ = q.shape
        ps = kv_cache.page_size
        if self.backend == "fp8mla" and self.attn_mode == "native":
            with torch.profiler.record_function("fp8mla::attention"):
                if s > 4:
                    out = dense_prefill(q, kv_cache.layer(layer), block_table, step.lengths,
                                        kv_format=kv_cache.fmt,
                                        softmax_scale=self.cfg.softmax_scale,
                                        fp8_scale=kv_cache.scale(layer), check=False)[0]
                    return out.view(b * s, h, LATENT_DIM)
                plan = _decode_plan(b, h, s, kv_cache.fmt, ps, block_table.shape[1] * ps,
                                    self.cfg.softmax_scale, q.device)
                out = torch.empty(b, s, h, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
                lse = torch.empty(b, s, h, dtype=torch.float32, device=q.device)
                plan.run(q, kv_cache.layer(layer), block_table, step.lengths,
                         fp8_scale=kv_cache.scale(layer), check=False, out=out, lse=lse)
            return out.view(b * s, h, LATENT_DIM)
        rows = q.view(b * s, h, KV_DIM)
        width = int(step.lengths.max())  # (a host sync) every row sees ≥ 1 token: its own
        request = torch.arange(b * s, device=q.device) // s
        outs = []
        plans = PlanCache()  # this call's own (prefill-sized plans are not kept for later steps)
        for r0, r1 in row_chunks(b * s, width, heads=h):
            idx = visible_slots(block_table, request[r0:r1], step.visible[r0:r1], width, ps)
            outs.append(self._attend(rows[r0:r1], kv_cache, layer, idx, step.visible[r0:r1],
                                     plans))
        return torch.cat(outs)

    def _attend(self, q, kv_cache, layer, idx, lengths=None, plans=None):
        """q [rows, heads, 576] over index lists idx int32 [rows, width] (slots, −1 = skip;
        ``lengths`` int32 [rows]: only the first lengths[r] entries count, where given).
        ``plans``: the caller's `PlanCache` to keep the plan in instead of the process's shared
        ones (`_sparse_plan`)."""
        scale = self.cfg.softmax_scale
        if self.backend == "reference":
            kv = kv_cache.dequantize(layer).reshape(-1, KV_DIM)
            return reference.sparse_mla(q, kv, idx, scale)[0]
        rows, fmt = kv_cache.layer(layer), kv_cache.fmt
        kv_scale = kv_cache.scale(layer)
        if self.attn_mode != "native" and fmt.is_fp8:
            # the baselines of the motivating deployment: cast to BF16 first (docs/DESIGN.md §1)
            with torch.profiler.record_function("fp8mla::cast"):
                if self.attn_mode == "full_cast":  # the whole pool, every layer, every step
                    rows = cast_rows_to_bf16(rows, fmt)
                else:  # gather_cast: only the listed rows
                    flat = rows.reshape(-1, fmt.row_bytes)
                    rows = cast_rows_to_bf16(flat[idx.clamp_min(0).long().flatten()], fmt)
                    rows = rows.unsqueeze(1)
                    idx = torch.where(idx >= 0, torch.arange(idx.numel(), device=idx.device,
                                                             dtype=torch.int32).view_as(idx), -1)
                if fmt.name == "fp8":
                    rows = (rows.float() * kv_scale).to(torch.bfloat16)
            fmt = "bf16"
        with torch.profiler.record_function("fp8mla::attention"):
            # fresh outputs: the plan (and its split workspace) is shared by every layer
            out = torch.empty(*q.shape[:2], LATENT_DIM, dtype=torch.bfloat16, device=q.device)
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
            plan = _sparse_plan(q.shape[0], q.shape[1], idx.shape[1], fmt, scale, q.device,
                                plans)
            return plan.run(q, rows, idx, lengths, fp8_scale=kv_scale, check=False, out=out,
                            lse=lse)[0]

    def _indexer(self, hidden, q_resid, cos, sin, index_cache, layer, slots, block_table,
                 positions, check=True, kv_page_size=None, projected=None, step=None):
        """Top-k per new token, −1 padded: token positions int64 [B, S, index_topk], or — on
        the paged decode path when the KV cache pages like the index cache — their KV slots,
        int32, straight from the top-k kernel. projected: (wq_b q_resid, wk hidden,
        weights_proj hidden) when the caller's fused GEMMs computed them."""
        cfg = self.cfg
        b, s, _ = hidden.shape
        hi = cfg.index_n_heads
        if projected is None:
            projected = (self.wq_b(q_resid), self.wk(hidden), self.weights_proj(hidden))
        q_index, k_index, w_index = projected
        q = q_index.reshape(b, s, hi, INDEX_HEAD_DIM)
        k = self.k_norm(k_index)
        if self.backend == "reference":
            q = q.float()
            q = torch.cat([apply_rope(q[..., :ROPE_DIM], cos, sin, cfg.indexer_rope_interleave),
                           q[..., ROPE_DIM:]], dim=-1)
            k = k.float()
            k = torch.cat([apply_rope(k[..., None, :ROPE_DIM], cos, sin,
                                      cfg.indexer_rope_interleave)[..., 0, :],
                           k[..., ROPE_DIM:]], -1)
        else:  # rope dims first, the rest copied: one kernel each (k in bf16, the type the
            # cache store takes, unless a Hadamard transform follows)
            q = rope_rows(q, cos, sin, cfg.indexer_rope_interleave)
            k_dtype = torch.float32 if cfg.indexer_hadamard else torch.bfloat16
            k = rope_rows(k[..., None, :], cos, sin, cfg.indexer_rope_interleave,
                          out_dtype=k_dtype)[..., 0, :]
        if cfg.indexer_hadamard:  # orthonormal: q·k unchanged, outliers spread before FP8
            hadamard = _hadamard(INDEX_HEAD_DIM, q.device)
            q, k = q @ hadamard, k @ hadamard
        if index_cache is None:
            raise ValueError("index_cache: required for a DSA model's layer")
        index_cache.store(layer, k.reshape(-1, INDEX_HEAD_DIM).to(torch.bfloat16),
                          slots.reshape(-1), check=check)
        # ReLU(c·x) = c·ReLU(x) for c > 0: the score scale and the head average fold into w
        w_mult = (hi ** -0.5) * (INDEX_HEAD_DIM ** -0.5)
        if self.backend == "fp8mla" and s <= 4:
            if step is None:
                step = self.step_inputs(positions, block_table, index_cache.page_size)
            return self._indexer_paged(q, w_index, w_mult, index_cache, layer, block_table,
                                       positions, step,
                                       slots_too=kv_page_size == index_cache.page_size,
                                       check=check)
        w = w_index.float() * w_mult
        keys, key_scales = index_cache.read(layer)
        out = torch.full((b, s, cfg.index_topk), -1, dtype=torch.int64, device=hidden.device)
        for r in range(b):
            n = int(positions[r, -1]) + 1
            pos = torch.arange(n, device=hidden.device)
            ctx_slots = (block_table[r, pos // index_cache.page_size].long()
                         * index_cache.page_size + pos % index_cache.page_size)
            ends = (positions[r] + 1).to(torch.int32)
            starts = torch.zeros_like(ends)
            if self.backend == "reference":
                kf = (keys[ctx_slots].view(torch.float8_e4m3fn).float()
                      * key_scales[ctx_slots, None])
            else:
                ctx_keys = keys[ctx_slots].contiguous()
                ctx_scales = key_scales[ctx_slots].contiguous()
            # the new tokens' logits rows [rows, n] CHUNK_ENTRIES at a time (a 32K-token
            # prompt's would be 4 GB at once)
            for r0, r1 in row_chunks(s, n):
                rows, lo, hi = slice(r0, r1), starts[r0:r1], ends[r0:r1]
                if self.backend == "reference":
                    logits = reference.indexer_logits(q[r, rows], w[r, rows], kf, lo, hi)
                    out[r, rows] = reference.topk_indices(logits, cfg.index_topk).long()
                    continue
                amax = q[r, rows].abs().amax(-1).clamp_min(1e-4)  # per (token, head)
                q_scale = amax / 448.0
                q8 = (q[r, rows] / q_scale[..., None]).to(torch.float8_e4m3fn)
                with torch.profiler.record_function("fp8mla::indexer"):
                    logits = indexer_logits_ragged(q8, (w[r, rows] * q_scale).contiguous(),
                                                   ctx_keys, ctx_scales, lo, hi, check=False)
                with torch.profiler.record_function("fp8mla::topk"):
                    out[r, rows] = topk_indices(logits, cfg.index_topk, lengths=hi).long()
        return out

    def _indexer_paged(self, q, w_index, w_mult, index_cache, layer, block_table, positions,
                       step, slots_too, check=False):
        """Decode form (s_q <= 4): paged keys, no host synchronisation (CUDA-graph safe) unless
        ``check`` (the indexer validates the block table's pages within the lengths).
        slots_too: return slots (int32) instead of positions (int64)."""
        cfg = self.cfg
        b, s = positions.shape
        q8, q_scale = quantize_rows_e4m3(q)  # per (token, head)
        lengths, visible = step.lengths, step.visible
        max_len = block_table.shape[1] * index_cache.page_size
        with torch.profiler.record_function("fp8mla::indexer"):
            # q's per-(token, head) scale and the score scale fold into the weights (float32)
            w = w_index.view(q_scale.shape) * (q_scale * w_mult)
            logits = indexer_logits_paged(q8, w.view(b * s, -1),
                                          index_cache.layer(layer), block_table, lengths,
                                          max_len=max_len, check=check)
        with torch.profiler.record_function("fp8mla::topk"):
            top = topk_indices(logits, cfg.index_topk, lengths=visible,
                               block_table=block_table if slots_too else None,
                               page_size=index_cache.page_size, rows_per_request=s)
        top = top.view(b, s, -1)
        return top if slots_too else top.long()
