"""The registered backends: fp8mla's kernels, external kernels, baselines, the reference.

Every external constraint below cites where it comes from. Where a fact could not be confirmed
(or changes between versions), the record is conservative and the comment says so. Nothing here
imports the backends; availability is probed lazily by `records.probe_available`.
"""

from __future__ import annotations

from fp8mla.backends.records import KV_FORMATS, BackendRecord, IntSet, Role, Tier

__all__ = ["REGISTRY", "backend_names", "records_for", "record_for", "candidates_for"]

_ALL_FORMATS = frozenset(KV_FORMATS)
_FP8_FORMATS = frozenset({"fp8", "fp8_ds_mla"})
_BF16 = frozenset({"bf16"})
# Compute capabilities Triton targets from Ampere up (docs/DESIGN.md §1, §7; Thor is 101 before
# CUDA 13, 110 after; each compiles: docs/kernels.md, "Compute capabilities").
_SM80_UP = frozenset({80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121})
_PAGES_1_256 = IntSet.powers_of_two(1, 256)
_LATENT = IntSet.of(512)
_ROPE = IntSet.of(64)

_FLASHMLA_INSTALL = "build it from https://github.com/deepseek-ai/FlashMLA (pip install -v .)"
_FLASHINFER_INSTALL = "pip install flashinfer-python"
_DEEPGEMM_INSTALL = "build it from https://github.com/deepseek-ai/DeepGEMM"


def _fp8mla(role: Role, attr: str, **kw) -> BackendRecord:
    """fp8mla's own Triton kernel for one role, available once ``fp8mla.ops.<attr>`` exists."""
    base = dict(
        kv_formats=_ALL_FORMATS, num_heads=IntSet(1, 128), page_sizes=_PAGES_1_256,
        kv_lora_rank=_LATENT, qk_rope_head_dim=_ROPE, s_q=IntSet(1, 4),
        compute_capabilities=_SM80_UP, cuda_graph_safe=True, needs_cuda=True,
        description="fp8mla Triton kernel: reads bf16 / fp8 / fp8_ds_mla (pow2 or fp32 scales) "
        "rows directly; any head count; needs CUDA (or TRITON_INTERPRET=1 on CPU)",
        source="fp8mla docs/DESIGN.md §1-§3 (this library)",
    )
    base.update(kw)
    return BackendRecord(name="fp8mla", roles=frozenset({role}), tier=Tier.NATIVE, priority=0,
                         entry_point=f"fp8mla.ops:{attr}", **base)


REGISTRY: tuple[BackendRecord, ...] = (
    # ---- fp8mla native kernels (preferred: they read FP8 directly) ----------------------------
    _fp8mla(Role.DENSE_DECODE, "dense_decode"),
    _fp8mla(Role.SPARSE_DECODE, "sparse_decode"),
    _fp8mla(Role.SPARSE_PREFILL, "sparse_prefill"),
    _fp8mla(Role.INDEXER, "indexer_logits", num_heads=IntSet(), index_n_heads=IntSet(1, 64),
            index_head_dim=IntSet.of(128)),
    _fp8mla(Role.TOPK, "topk_indices", num_heads=IntSet()),
    # Dense prefill: the dense decode kernel over groups of new tokens (`fp8mla.prefill`); it
    # builds its plans on every call, so it is not CUDA-graph safe.
    _fp8mla(Role.DENSE_PREFILL, "dense_prefill", cuda_graph_safe=False,
            description="fp8mla dense prefill: the dense decode kernel over groups of new "
            "tokens, causal among them (plans built on every call); any head "
            "count; needs CUDA (or TRITON_INTERPRET=1 on CPU)"),
    # ---- FlashMLA (deepseek-ai/FlashMLA) ------------------------------------------------------
    # Dense decode: README support matrix "Dense Decoding | SM90 | MQA | BF16"; the dense decode
    # API checks `page_block_size == 64` ("Currently page_block_size must be 64"),
    # `head_size_k == 576 || 512`, `head_size_v == 512`, and only `num_heads_q % num_heads_k`
    # (h_kv = 1: any head count); it dispatches to sm90 kernels only, for BF16/FP16 q and KV.
    # Sources: github.com/deepseek-ai/FlashMLA README.md; csrc/.../dense decode API.
    BackendRecord(
        name="flashmla", roles=frozenset({Role.DENSE_DECODE}), tier=Tier.EXTERNAL, priority=10,
        kv_formats=_BF16, page_sizes=IntSet.of(64), kv_lora_rank=_LATENT,
        qk_rope_head_dim=_ROPE, compute_capabilities=frozenset({90}), cuda_graph_safe=True,
        entry_point="flash_mla", install_hint=_FLASHMLA_INSTALL,
        description="FlashMLA dense decode (flash_mla_with_kvcache), BF16 KV, SM90",
        source="FlashMLA README support matrix; dense decode API page_block_size == 64 check",
        hints=(("kv_format", "FlashMLA's dense decode reads BF16 KV only"),
               ("page_size", "FlashMLA checks page_block_size == 64"),
               ("compute_capability", "FlashMLA's dense decode is built for SM90 only")),
    ),
    # Sparse decode / prefill: README "Sparse Decoding | SM90 & SM100 | MQA | FP8" (656-byte
    # "FP8 with scale" rows = fp8_ds_mla) and "Sparse Prefill | SM90 & SM100" (BF16 KV; engines
    # dequantize gathered fp8_ds_mla rows first, as SGLang's nsa backend does; vLLM's
    # FlashMLA-sparse backend serves BF16 caches through the prefill kernel). Heads: the sparse
    # decode API accepts h_q == 64 or 128 only ("Unsupported h_q", csrc/api/sparse_decode.cpp);
    # vLLM PR #46189 notes Hopper sparse supports q_head 64 only and pads (128 on Blackwell);
    # docs/DESIGN.md §5: H=8 and H=32 crash. Page size: the sparse kernels address slots, but every
    # engine runs them with 64-token pages (vLLM FlashMLA-sparse block size 64; SGLang forces
    # page size 64 for DSA models, DeepSeek-V3.2-Exp PR #6) — not confirmed that other sizes
    # work, so conservative: 64. Newer FlashMLA builds move sparse decode to SM100-family only
    # (sparse_decode.cpp checks is_sm100f); we keep the README's SM90 & SM100.
    BackendRecord(
        name="flashmla", roles=frozenset({Role.SPARSE_DECODE, Role.SPARSE_PREFILL}),
        tier=Tier.EXTERNAL, priority=10, kv_formats=frozenset({"bf16", "fp8_ds_mla"}),
        num_heads=IntSet.of(64, 128), page_sizes=IntSet.of(64), kv_lora_rank=_LATENT,
        qk_rope_head_dim=_ROPE, compute_capabilities=frozenset({90, 100}), cuda_graph_safe=True,
        entry_point="flash_mla", install_hint=_FLASHMLA_INSTALL,
        description="FlashMLA token-level sparse attention (fp8_ds_mla decode, BF16 prefill)",
        source="FlashMLA README support matrix; csrc/api/sparse_decode.cpp h_q check; "
        "vLLM PR #46189; docs/DESIGN.md §5",
        hints=(("num_heads", "FlashMLA's sparse kernels take exactly 64 or 128 heads; H=8/32 "
                "crash, engines pad to 64 at a cost of 64/H x compute"),
               ("kv_format", "FlashMLA sparse reads the 656-byte fp8_ds_mla rows or BF16"),
               ("page_size", "engines run FlashMLA sparse with 64-token pages only"),
               ("compute_capability", "FlashMLA's sparse kernels are built for SM90/SM100")),
    ),
    # ---- FlashInfer MLA (flashinfer-ai/flashinfer) --------------------------------------------
    # BatchMLAPagedAttentionWrapper (FA2/FA3 paths): 16-bit KV only — its kernels
    # static_assert(sizeof(DTypeKV) == 2) (docs/DESIGN.md §1: the cause of the whole-pool cast on
    # SM120). FlashInfer PR #3694 (2026) adds per-tensor e4m3 KV on the SM90 FA3 path only; not
    # modelled (version-dependent), conservative: bf16. head_dim_ckv 512 / head_dim_kpe 64.
    # Page size: any (SGLang's flashinfer MLA backend runs page size 1). Graph-safe (SGLang and
    # vLLM capture it).
    BackendRecord(
        name="flashinfer", roles=frozenset({Role.DENSE_DECODE, Role.DENSE_PREFILL}),
        tier=Tier.EXTERNAL, priority=12, kv_formats=_BF16, kv_lora_rank=_LATENT,
        qk_rope_head_dim=_ROPE, compute_capabilities=_SM80_UP, cuda_graph_safe=True,
        entry_point="flashinfer", install_hint=_FLASHINFER_INSTALL,
        description="FlashInfer BatchMLAPagedAttentionWrapper (FA2/FA3), 16-bit KV",
        source="FlashInfer attention kernels static_assert(sizeof(DTypeKV) == 2); "
        "FlashInfer PR #3694; docs/DESIGN.md §1",
        hints=(("kv_format", "FlashInfer's MLA kernels static_assert(sizeof(DType) == 2): "
                "16-bit KV only, so an FP8 pool must be cast to BF16 first"),),
    ),
    # TRT-LLM-gen MLA decode through FlashInfer (trtllm_batch_decode_with_kv_cache_mla):
    # flashinfer/mla.py _check_trtllm_gen_mla_shape raises "Expected qk_nope_head_dim == 128"
    # (newer releases also accept GLM-5's 192; vLLM now allows 64/128/192 — version-dependent,
    # conservative: 128). vLLM's FLASHINFER_MLA backend: kernel block sizes [32, 64],
    # supports_compute_capability major == 10, KV dtypes bf16/fp16/fp8 (per-tensor scale).
    # Heads: trtllm-gen tiles 8/16/64 heads and rejects counts it cannot tile (e.g. 96); all
    # per-rank counts of our presets are multiples of the tile.
    BackendRecord(
        name="flashinfer_trtllm", roles=frozenset({Role.DENSE_DECODE}), tier=Tier.EXTERNAL,
        priority=11, kv_formats=frozenset({"bf16", "fp8"}), num_heads=IntSet(1, 128),
        page_sizes=IntSet.of(32, 64), kv_lora_rank=_LATENT, qk_rope_head_dim=_ROPE,
        qk_nope_head_dim=IntSet.of(128), compute_capabilities=frozenset({100, 103}),
        cuda_graph_safe=True, entry_point="flashinfer", install_hint=_FLASHINFER_INSTALL,
        description="TRT-LLM-gen MLA decode via FlashInfer, SM100 family",
        source="flashinfer/mla.py _check_trtllm_gen_mla_shape; vLLM "
        "v1/attention/backends/mla/flashinfer_mla.py (block sizes, compute capability)",
        hints=(("qk_nope_head_dim", "the TRT-LLM-gen MLA path checks qk_nope_head_dim == 128"),
               ("page_size", "TRT-LLM-gen MLA kernels take 32- or 64-token pages"),
               ("compute_capability", "TRT-LLM-gen MLA kernels are built for SM100-family")),
    ),
    # ---- DeepGEMM lightning-indexer logits (deepseek-ai/DeepGEMM) -----------------------------
    # fp8_paged_mqa_logits: SM90 kernel DG_STATIC_ASSERT(BLOCK_KV == 64) (SM100 also takes 32
    # in newer versions; conservative: 64); host checks `num_heads == 32 || num_heads == 64`
    # (older: 128 % num_heads == 0), head_dim 32/64/128 (DSA uses 128), next_n 1 or 2 (newer:
    # 4). Built for SM90 / SM100 (csrc/jit_kernels/impls/smxx_fp8_paged_mqa_logits.hpp).
    BackendRecord(
        name="deepgemm", roles=frozenset({Role.INDEXER}), tier=Tier.EXTERNAL, priority=10,
        kv_formats=_ALL_FORMATS, page_sizes=IntSet.of(64), index_n_heads=IntSet.of(32, 64),
        index_head_dim=IntSet.of(128), s_q=IntSet.of(1, 2),
        compute_capabilities=frozenset({90, 100}), cuda_graph_safe=True,
        entry_point="deep_gemm", install_hint=_DEEPGEMM_INSTALL,
        description="DeepGEMM fp8_paged_mqa_logits (indexer logits over the paged FP8 key cache)",
        source="DeepGEMM smxx_fp8_paged_mqa_logits.hpp / sm90_fp8_paged_mqa_logits.cuh",
        hints=(("page_size", "DeepGEMM's paged MQA logits kernel needs block_kv == 64"),
               ("compute_capability", "DeepGEMM's indexer kernels are built for SM90/SM100")),
    ),
    # ---- baselines ----------------------------------------------------------------------------
    BackendRecord(
        name="gather_cast", roles=frozenset({Role.DENSE_DECODE}), tier=Tier.BASELINE,
        priority=20, kv_formats=_FP8_FORMATS, cuda_graph_safe=False, needs_cuda=True,
        description="gathers the request's FP8 rows, casts them to BF16, then BF16 attention "
        "(+29% on the motivating deployment); gathered length is data-dependent, so not "
        "graph-safe as written",
        source="docs/DESIGN.md §1, §5",
        hints=(("kv_format", "a BF16 pool has nothing to cast: choose a BF16 backend"),),
    ),
    BackendRecord(
        name="full_cast", roles=frozenset({Role.DENSE_DECODE}), tier=Tier.BASELINE, priority=21,
        kv_formats=_FP8_FORMATS, cuda_graph_safe=True, needs_cuda=True,
        description="casts the whole FP8 pool to BF16 on every layer of every step, then BF16 "
        "attention: the pathology that cost 69% of decode time (docs/DESIGN.md §1)",
        source="docs/DESIGN.md §1, §5",
        hints=(("kv_format", "a BF16 pool has nothing to cast: choose a BF16 backend"),),
    ),
    BackendRecord(
        name="reference", roles=frozenset(Role), tier=Tier.REFERENCE, priority=30,
        kv_formats=_ALL_FORMATS, cuda_graph_safe=False, needs_cuda=False,
        entry_point="fp8mla.reference",
        description="PyTorch float32 oracle for every role: any device including CPU; slow, "
        "host-synchronising, not graph-safe",
        source="fp8mla.reference",
    ),
)


def backend_names() -> list[str]:
    """Registered backend names, sorted."""
    return sorted({r.name for r in REGISTRY})


def records_for(name: str) -> tuple[BackendRecord, ...]:
    """All records of backend ``name``; ValueError listing the valid names if unknown."""
    found = tuple(r for r in REGISTRY if r.name == name)
    if not found:
        raise ValueError(f"backend: unknown backend {name!r}; valid: {', '.join(backend_names())}")
    return found


def record_for(name: str, role: Role) -> BackendRecord | None:
    """The record of backend ``name`` that covers ``role``, or None if it has none."""
    for r in records_for(name):
        if role in r.roles:
            return r
    return None


def candidates_for(role: Role) -> list[BackendRecord]:
    """Records that implement ``role``, in preference order (tier, then priority)."""
    return sorted((r for r in REGISTRY if role in r.roles), key=lambda r: (r.tier, r.priority))
