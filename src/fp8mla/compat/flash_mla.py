"""FlashMLA's Python interface (``flash_mla``), served by fp8mla's kernels on any GPU.

Signatures, shapes, layouts and return values follow FlashMLA's ``flash_mla_interface.py``:
``get_mla_metadata``, ``flash_mla_with_kvcache`` (dense and sparse decode) and
``flash_mla_sparse_fwd`` (sparse prefill). Checks FlashMLA makes with ``assert`` raise
``ValueError`` here, with the same meaning.

Intended differences (where FlashMLA refuses, fp8mla serves):
- any head count 1–128 (FlashMLA sparse: 64 or 128), any power-of-two page size 1–256 (dense:
  64), FP8 dense decode (656-byte ``fp8_ds_mla`` rows; 576-byte per-tensor e4m3 rows with scale
  1), BF16 sparse decode with ``is_fp8_kvcache=False``;
- dense decode of more than 4 queries a request runs the kernels on runs of 4 (`_QueryRuns`),
  each reading the request's pages again;
- a schedule object is reusable while the shapes stay the same — ``cache_seqlens`` values may
  change between calls (FlashMLA asks that they stay the same);
- FlashMLA's earlier interface is served too (sgl_kernel's, `fp8mla.compat.sgl_flash_mla`): a
  ``tile_scheduler_metadata`` tensor with a ``num_splits`` tensor, both from that interface's
  ``get_mla_metadata``; their contents are not read (plans are kept per problem shape,
  `fp8mla._plans.PlanCache`);
- a dense block table is read by its row stride, as FlashMLA reads it: a narrow view of a
  wider buffer is widened to its rows (`_whole_rows`), and the plan is sized for that width;
- batch-invariant results where asked: a `FlashMLASchedMeta` given a one-partition schedule by
  its caller (`_single_partition`), or any call while `INVARIANT_ENV`'s ``VLLM_BATCH_INVARIANT``
  / ``FP8MLA_BATCH_INVARIANT`` is set (`invariant_mode`), runs plans of one split per request
  whose kernel does not follow the batch (`DecodePlan`'s ``batch_invariant``); otherwise
  `flash_mla_sparse_fwd`'s split count follows its token count (FlashMLA's kernel never
  splits);
- ``extra_k_cache`` / ``extra_indices_in_kvcache`` / ``extra_topk_length`` / ``indexer_topk``
  are not supported (an error unless None / 0).
Lonely queries (nothing to attend) return out 0 and lse +inf, as FlashMLA does.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton

from fp8mla._checks import argument_names, check_tensor
from fp8mla._plans import PlanCache
from fp8mla.decode import DecodePlan
from fp8mla.formats import KV_DIM, LATENT_DIM
from fp8mla.numerics import enabled as validating
from fp8mla.sparse import SparsePlan

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache",
           "flash_mla_sparse_fwd"]


@dataclasses.dataclass
class FlashMLASchedMeta:
    """The schedule handle: the problem of its first call, and the fp8mla plan built for it.

    ``tile_scheduler_metadata`` / ``num_splits``: FlashMLA's schedule tensors, which fp8mla
    does not fill. A caller that sets a schedule of one partition ([1, 8]) before the first
    call — vLLM's batch-invariant mode forces FlashMLA's single partition that way — gets
    batch-invariant plans (one split a request, a kernel chosen whatever the batch size and
    the table's width): each request's result then does not depend on the rest of the
    batch, dense or sparse."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None

    have_initialized: bool = False
    config: Config | None = None
    plan: DecodePlan | None = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """A fresh, empty schedule (arguments accepted and ignored, as FlashMLA's current interface
    does); the plan is built on the first `flash_mla_with_kvcache` call."""
    return FlashMLASchedMeta(), None


def _kv_format(k_cache: torch.Tensor, is_fp8_kvcache: bool) -> str:
    d = k_cache.shape[-1]
    if not is_fp8_kvcache:
        if k_cache.dtype != torch.bfloat16 or d != KV_DIM:
            raise ValueError(f"k_cache: with is_fp8_kvcache=False expected bfloat16 [..., {KV_DIM}],"
                             f" got {k_cache.dtype} [..., {d}]")
        return "bf16"
    if k_cache.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn):
        raise ValueError(f"k_cache: with is_fp8_kvcache=True expected 1-byte elements, got "
                         f"{k_cache.dtype}")
    if d == 656:
        return "fp8_ds_mla"
    if d == KV_DIM:
        return "fp8"
    raise ValueError(f"k_cache: FP8 rows must be 656 bytes (fp8_ds_mla) or 576 (per-tensor e4m3),"
                     f" got {d}")


def _check_config(meta: FlashMLASchedMeta, cfg: FlashMLASchedMeta.Config) -> None:
    if not meta.have_initialized or meta.config == cfg:
        return
    for field in dataclasses.fields(cfg):
        have, want = getattr(meta.config, field.name), getattr(cfg, field.name)
        if have != want:
            raise ValueError(
                f"tile_scheduler_metadata: built for {field.name}={have}, called with {want}. "
                "Your input arguments are inconsistent with sched_meta: use one schedule per "
                "problem shape (get_mla_metadata again for another)."
            )


def _check_tensors(**tensors: object) -> None:
    """TypeError naming the first argument that is neither a tensor nor None."""
    for name, t in tensors.items():
        if t is not None:
            check_tensor(name, t)


def _check_sink(attn_sink: torch.Tensor | None, h_q: int) -> None:
    """attn_sink: None or float32 [h_q] (checked before any launch)."""
    if attn_sink is not None and (attn_sink.dtype != torch.float32
                                  or attn_sink.shape != (h_q,)):
        raise ValueError(f"attn_sink: expected float32 [{h_q}], got {attn_sink.dtype} "
                         f"{list(attn_sink.shape)}")


def _apply_sink(out: torch.Tensor, lse: torch.Tensor,
                attn_sink: torch.Tensor | None) -> torch.Tensor:
    """out [.., h_q, 512] scaled by e^lse / (e^lse + e^sink) per head (lse [.., h_q], +inf
    where nothing was attended: out stays 0; attn_sink checked by `_check_sink`); out itself
    without a sink."""
    if attn_sink is None:
        return out
    # a query with nothing attended (lse +inf) keeps out 0 whatever the sink (+inf − +inf
    # would make its factor NaN)
    factor = torch.sigmoid(lse - attn_sink).masked_fill(lse == float("inf"), 0.0)
    return (out.float() * factor.unsqueeze(-1)).to(out.dtype)


K_CACHE = {"kv_cache": "k_cache"}  # the plans' name for it, as FlashMLA's callers name it
MAX_S_Q = 4  # queries a request the dense decode kernels take at once
# the table span a forced single-partition schedule plans for (its kernel must not depend on
# the batch's widest table)
INVARIANT_SPAN = 1 << 20
# the environment variables that make every plan of this interface batch-invariant: vLLM's
# batch-invariant mode (which also forces FlashMLA's one-partition schedule) and fp8mla's own
INVARIANT_ENV = ("VLLM_BATCH_INVARIANT", "FP8MLA_BATCH_INVARIANT")
# plans of the earlier interface's calls (tensor schedules carry none), by problem shape
_TENSOR_SCHEDULE_PLANS = PlanCache()


def _schedule(meta: object, num_splits: object) -> bool:
    """Which interface the schedule arguments follow: True for the earlier one (tensors)."""
    if isinstance(meta, torch.Tensor):
        if not isinstance(num_splits, torch.Tensor):
            raise TypeError("num_splits: with a tile_scheduler_metadata tensor (FlashMLA's "
                            "earlier interface) expected the int32 tensor get_mla_metadata "
                            f"returned with it, got {type(num_splits).__name__}")
        return True
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError("tile_scheduler_metadata: expected the FlashMLASchedMeta from "
                        f"get_mla_metadata, got {type(meta).__name__}")
    if num_splits is not None:
        raise ValueError("num_splits: must be None with a FlashMLASchedMeta (FlashMLA's current "
                         "interface)")
    return False


class _QueryRuns:
    """Dense decode of more queries a request than the decode kernels take (`MAX_S_Q`; FlashMLA
    takes any s_q, and vLLM sends uniform batches of up to 128 a request its way) as runs of
    ≤ `MAX_S_Q`: in a causal call, queries [a, a + k) see the request's length less the
    s_q − a − k queries after them. Each run reads the request's pages again."""

    def __init__(self, cfg: FlashMLASchedMeta.Config, make) -> None:
        self.s_q, self.causal = cfg.s_q, cfg.causal
        self.runs = [(a, min(MAX_S_Q, cfg.s_q - a)) for a in range(0, cfg.s_q, MAX_S_Q)]
        self.plans = {k: make(k) for _, k in self.runs}

    def run(self, q, kv_cache, block_table, cache_seqlens, *, fp8_scale, check, out, lse,
            empty_lse):
        for a, k in self.runs:
            later = self.s_q - a - k if self.causal else 0
            lens = (cache_seqlens - later).clamp_min(0) if later else cache_seqlens
            self.plans[k].run(q[:, a:a + k], kv_cache, block_table, lens, fp8_scale=fp8_scale,
                              check=check, out=out[:, a:a + k], lse=lse[:, a:a + k],
                              empty_lse=empty_lse)


def _whole_rows(block_table: torch.Tensor) -> torch.Tensor:
    """The block table as wide as its rows are apart in memory, a view. FlashMLA reads a table
    by its row stride and the lengths alone, so engines pass a narrow view of a wider buffer
    (SGLang captures its graphs with a one-page view, then writes longer tables into the
    buffer for the replays); the kernels here stop at the view's width, which a graph keeps."""
    if block_table.dim() != 2 or block_table.stride(-1) != 1 or block_table.shape[0] == 0:
        return block_table  # (the plan's checks name what is wrong)
    rows, row = block_table.shape[0], block_table.stride(0)
    left = (block_table.untyped_storage().nbytes() // block_table.element_size()
            - block_table.storage_offset() - (rows - 1) * row)  # the last row's room
    width = min(row, left)
    if width <= block_table.shape[1]:
        return block_table
    return block_table.as_strided((rows, width), (row, 1))


def invariant_mode() -> bool:
    """Whether the environment asks for batch-invariant results: `INVARIANT_ENV`'s variables,
    any of them set to a value other than "", "0", "false", "no" or "off" (read at each call;
    plans already made keep what they were made with)."""
    return any(os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")
               for name in INVARIANT_ENV)


def _single_partition(tile_scheduler_metadata: object) -> bool:
    """Whether a caller set a schedule of one partition (vLLM's batch-invariant mode): FlashMLA
    runs every request in one split then. Other caller-set schedules are not read."""
    return (isinstance(tile_scheduler_metadata, torch.Tensor)
            and tile_scheduler_metadata.dim() == 2 and tile_scheduler_metadata.shape[0] == 1)


def _make_plan(cfg: FlashMLASchedMeta.Config, fmt: str, scale: float, span: int,
               device: torch.device, invariant: bool) -> DecodePlan | _QueryRuns:
    """The plan of one problem: sparse over ``cfg.topk`` entries, else dense over a block
    table spanning ``span`` tokens (in runs of queries above `MAX_S_Q`); ``invariant``: the
    plans' ``batch_invariant``. The plans hold no outputs of their own: every call passes
    fresh ones, as FlashMLA returns."""
    if cfg.topk is not None:
        return SparsePlan(num_queries=cfg.b * cfg.s_q, num_heads=cfg.h_q, topk=cfg.topk,
                          kv_format=fmt, softmax_scale=scale, device=device,
                          batch_invariant=invariant, own_outputs=False)

    def dense(s_q: int) -> DecodePlan:
        return DecodePlan(batch=cfg.b, num_heads=cfg.h_q, s_q=s_q, kv_format=fmt,
                          page_size=cfg.page_block_size, max_seqlen=span, softmax_scale=scale,
                          device=device, causal=cfg.causal or s_q == 1,
                          batch_invariant=invariant, own_outputs=False)

    return dense(cfg.s_q) if cfg.s_q <= MAX_S_Q else _QueryRuns(cfg, dense)


def flash_mla_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None, head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta | torch.Tensor,
    num_splits: torch.Tensor | None = None,
    softmax_scale: float | None = None, causal: bool = False, is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None, extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense or sparse MLA decode (FlashMLA semantics).

    q: [b, s_q, h_q, 576] bfloat16; k_cache: [num_blocks, page_block_size, 1, 576] bfloat16, or
    1-byte rows [.., 1, 656] (fp8_ds_mla) / [.., 1, 576] (per-tensor e4m3, scale 1) with
    is_fp8_kvcache; block_table: int32 [b, max_blocks] and cache_seqlens: int32 [b] (dense);
    tile_scheduler_metadata: the FlashMLASchedMeta from `get_mla_metadata` (num_splits None),
    or the earlier interface's int32 tensor with its int32 num_splits tensor
    (`fp8mla.compat.sgl_flash_mla.get_mla_metadata`); indices: int32 [b, s_q, topk] slots, −1
    invalid (sparse); topk_length: int32 [b]; attn_sink: float32 [h_q]; extra_k_cache /
    extra_indices_in_kvcache / extra_topk_length: not supported (None). Returns (out bfloat16
    [b, s_q, h_q, 512], lse float32 [b, h_q, s_q]).
    """
    return _with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                         tile_scheduler_metadata, num_splits, softmax_scale, causal,
                         is_fp8_kvcache, indices, attn_sink=attn_sink,
                         extra_k_cache=extra_k_cache,
                         extra_indices_in_kvcache=extra_indices_in_kvcache,
                         topk_length=topk_length, extra_topk_length=extra_topk_length)


def _with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                  num_splits, softmax_scale, causal, is_fp8_kvcache, indices, *, attn_sink=None,
                  extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                  extra_topk_length=None, fp8_scale: torch.Tensor | None = None):
    """`flash_mla_with_kvcache`, and the scale of a 576-byte e4m3 pool (``fp8_scale``: float32
    [1], sgl_kernel's ``descale_k``; 1 where None)."""
    meta = tile_scheduler_metadata
    tensor_schedule = _schedule(meta, num_splits)
    if head_dim_v != LATENT_DIM:
        raise ValueError(f"head_dim_v: must be {LATENT_DIM}, got {head_dim_v}")
    for name, value in (("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise ValueError(f"{name}: not supported by fp8mla (pass None)")
    _check_tensors(q=q, k_cache=k_cache, attn_sink=attn_sink)
    if q.dim() != 4 or q.shape[-1] != KV_DIM:
        raise ValueError(f"q: expected [b, s_q, h_q, {KV_DIM}], got {list(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1:
        raise ValueError(f"k_cache: expected [num_blocks, page_block_size, 1, head_dim] (h_k = 1),"
                         f" got {list(k_cache.shape)}")
    b, s_q, h_q, _ = q.shape
    _check_sink(attn_sink, h_q)
    fmt = _kv_format(k_cache, is_fp8_kvcache)
    scale = KV_DIM ** -0.5 if softmax_scale is None else softmax_scale
    sparse = indices is not None
    cfg = FlashMLASchedMeta.Config(b, s_q, h_q, k_cache.shape[1], k_cache.shape[2], causal,
                                   is_fp8_kvcache, indices.shape[-1] if sparse else None)
    if sparse:
        if causal:
            raise ValueError("causal: must be False when indices is given (sparse attention)")
        if indices.dtype != torch.int32 or tuple(indices.shape[:2]) != (b, s_q):
            raise ValueError(f"indices: expected int32 [{b}, {s_q}, topk], got {indices.dtype} "
                             f"{list(indices.shape)}")
        span = 0
    else:
        if topk_length is not None or attn_sink is not None:
            raise ValueError("topk_length, attn_sink: only with indices (sparse attention)")
        if block_table is None or cache_seqlens is None:
            raise ValueError("block_table, cache_seqlens: required for dense attention")
        _check_tensors(block_table=block_table)
        block_table = _whole_rows(block_table)
        span = block_table.shape[-1] * k_cache.shape[1]
    # batch-invariant plans (one split a request, a kernel chosen whatever the batch and the
    # table's width) where the environment or the caller's schedule asks for them; read only
    # where a plan is looked up or made (not on a schedule object's later calls)
    if tensor_schedule:  # one plan per shape, sized for a power-of-two span of the table
        invariant = invariant_mode()
        span = INVARIANT_SPAN if invariant else (triton.next_power_of_2(span) if span else 0)
        plan = _TENSOR_SCHEDULE_PLANS.get(
            (cfg, fmt, scale, span, invariant, str(q.device)),
            lambda: _make_plan(cfg, fmt, scale, span, q.device, invariant))
    else:
        _check_config(meta, cfg)
        if not meta.have_initialized:
            invariant = invariant_mode() or _single_partition(meta.tile_scheduler_metadata)
            meta.plan = _make_plan(cfg, fmt, scale, INVARIANT_SPAN if invariant else span,
                                   q.device, invariant)
        plan = meta.plan
    # fresh outputs, as FlashMLA returns; the kernels write lse straight into its [b, h_q, s_q]
    # layout, +inf for a query with nothing to attend
    out = torch.empty(b, s_q, h_q, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    inf = float("inf")
    # sparse index lists are never validated here: FlashMLA's semantics skip entries −1 or past
    # the pool (and past topk_length), which the kernels do (`fp8mla.sparse`); dense lengths and
    # tables are validated in the diagnosis mode (`validating`)
    if sparse:
        lengths = None
        if topk_length is not None:
            if topk_length.dtype != torch.int32 or topk_length.shape != (b,):
                raise ValueError(f"topk_length: expected int32 [{b}], got {topk_length.dtype} "
                                 f"{list(topk_length.shape)}")
            lengths = topk_length if s_q == 1 else topk_length.repeat_interleave(s_q)
        flat_out = out.view(b * s_q, h_q, LATENT_DIM)
        if s_q == 1:  # lse [b, h_q, 1] is the plan's [queries, h_q]
            with argument_names(K_CACHE):
                plan.run(q[:, 0], k_cache, indices[:, 0], lengths,
                         check=False, out=flat_out, lse=lse.view(b, h_q), empty_lse=inf)
        else:  # queries b·s_q do not map onto [b, h_q, s_q] with strides: one transpose
            rows_lse = torch.empty(b * s_q, h_q, dtype=torch.float32, device=q.device)
            with argument_names(K_CACHE):
                plan.run(q.reshape(b * s_q, h_q, KV_DIM), k_cache, indices.reshape(b * s_q, -1),
                         lengths, check=False, out=flat_out, lse=rows_lse, empty_lse=inf)
            lse.copy_(rows_lse.view(b, s_q, h_q).transpose(1, 2))
    else:
        with argument_names(K_CACHE):
            plan.run(q, k_cache, block_table, cache_seqlens, fp8_scale=fp8_scale,
                     check=validating(), out=out, lse=lse.transpose(1, 2), empty_lse=inf)
    if not tensor_schedule:
        meta.have_initialized, meta.config = True, cfg
    return _apply_sink(out, lse.transpose(1, 2), attn_sink), lse


def flash_mla_sparse_fwd(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
    attn_sink: torch.Tensor | None = None, topk_length: torch.Tensor | None = None,
    indexer_topk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill (FlashMLA semantics).

    q: [s_q, h_q, 576] bfloat16; kv: [s_kv, 1, 576] bfloat16 (fp8mla also takes 1-byte
    [s_kv, 1, 656] fp8_ds_mla rows); indices: int32 [s_q, 1, topk], −1 or >= s_kv invalid;
    attn_sink: float32 [h_q]; topk_length: int32 [s_q]. Returns (out bfloat16 [s_q, h_q, 512],
    max_logits float32 [s_q, h_q], lse float32 [s_q, h_q]).
    """
    if d_v != LATENT_DIM:
        raise ValueError(f"d_v: can only be {LATENT_DIM}, got {d_v}")
    if indexer_topk:
        raise ValueError("indexer_topk: not supported by fp8mla (pass 0)")
    _check_tensors(q=q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length)
    if q.dim() != 3 or kv.dim() != 3 or kv.shape[1] != 1:
        raise ValueError(f"q, kv: expected [s_q, h_q, d_qk] and [s_kv, 1, d_qk], got "
                         f"{list(q.shape)} and {list(kv.shape)}")
    if indices.dim() != 3 or indices.shape[:2] != (q.shape[0], 1) or indices.dtype != torch.int32:
        raise ValueError(f"indices: expected int32 [{q.shape[0]}, 1, topk], got {indices.dtype} "
                         f"{list(indices.shape)}")
    with argument_names({"k_cache": "kv"}):
        fmt = "bf16" if kv.dtype == torch.bfloat16 else _kv_format(kv, True)
    s_q, h_q = q.shape[0], q.shape[1]
    _check_sink(attn_sink, h_q)
    with argument_names({"softmax_scale": "sm_scale"}):
        plan = SparsePlan(num_queries=s_q, num_heads=h_q, topk=indices.shape[-1],
                          kv_format=fmt, softmax_scale=sm_scale, device=q.device,
                          batch_invariant=invariant_mode())
    with argument_names({"kv_cache": "kv"}):
        out, lse = plan.run(q, kv, indices[:, 0], topk_length, check=False,
                            empty_lse=float("inf"))
    # the plan is this call's own: its buffers are fresh tensors
    return _apply_sink(out, lse, attn_sink), plan.max_logits[:, 0], lse
