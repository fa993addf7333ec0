"""Resolution over presets x GPUs x formats x page sizes x TP, with expected choices/reasons."""

import pytest

from fp8mla.backends import BackendChoiceError, Role, Runtime, needed_roles, resolve
from fp8mla.backends.records import probe_available
from fp8mla.config import preset
from fp8mla.gpus import resolve_gpu

DSA_ROLES = [Role.SPARSE_PREFILL, Role.INDEXER, Role.TOPK, Role.SPARSE_DECODE]


NO_DENSE_PREFILL = "dense_prefill kernel not implemented in this version"


def everything(record):
    """Probe: every library installed, every fp8mla kernel landed except dense prefill (a
    version before `fp8mla.prefill`: how a missing kernel of fp8mla's shows)."""
    return NO_DENSE_PREFILL if record.entry_point == "fp8mla.ops:dense_prefill" else None


def nothing_external(record):
    """Probe: fp8mla kernels present (not dense prefill), no external library installed."""
    if record.entry_point is None or record.entry_point.startswith("fp8mla"):
        return everything(record)
    return f"module {record.entry_point} is not installed here"


def kernels_missing(record):
    """Probe: this version — no fp8mla kernels, no external libraries; reference present."""
    if record.entry_point is None or record.entry_point == "fp8mla.reference":
        return None
    return "not here"


def rt(gpu="rtx-pro-6000", **kw):
    kw.setdefault("tp_size", 8)
    return Runtime(gpu=resolve_gpu(gpu), **kw)


def test_needed_roles():
    assert needed_roles(preset("deepseek_v3")) == [Role.DENSE_PREFILL, Role.DENSE_DECODE]
    assert needed_roles(preset("glm5")) == DSA_ROLES
    assert needed_roles(preset("glm5"), {Role.DENSE_DECODE}) == [
        Role.SPARSE_PREFILL, Role.INDEXER, Role.TOPK, Role.DENSE_DECODE]


# (model, gpu, kv_format, page_size, tp) -> expected backend per role, with every library present.
CASES = [
    # fp8mla first whenever it serves: any GPU sm80+, any heads, pow2 pages.
    ("glm5", "rtx-pro-6000", "fp8_ds_mla", 64, 8, dict.fromkeys(DSA_ROLES, "fp8mla")),
    ("glm5", "h200", "fp8_ds_mla", 64, 8, dict.fromkeys(DSA_ROLES, "fp8mla")),
    ("deepseek_v32", "b200", "fp8", 1, 1, dict.fromkeys(DSA_ROLES, "fp8mla")),
    ("glm5", "a100", "bf16", 256, 2, dict.fromkeys(DSA_ROLES, "fp8mla")),
    # page size 48 is no power of two: fp8mla, FlashMLA and DeepGEMM reject; reference serves.
    ("glm5", "h200", "fp8_ds_mla", 48, 1, dict.fromkeys(DSA_ROLES, "reference")),
    # dense models: no fp8mla dense prefill in this version, FlashInfer serves BF16 only.
    ("deepseek_v3", "h100", "fp8", 64, 8,
     {Role.DENSE_PREFILL: "reference", Role.DENSE_DECODE: "fp8mla"}),
    ("kimi_k2", "l40s", "bf16", 16, 4,
     {Role.DENSE_PREFILL: "flashinfer", Role.DENSE_DECODE: "fp8mla"}),
    # 8-bit pages of 512 tokens: fp8mla (<=256) out; fp8 -> gather_cast is the best left.
    ("deepseek_v3", "h200", "fp8", 512, 8,
     {Role.DENSE_PREFILL: "reference", Role.DENSE_DECODE: "gather_cast"}),
    # sm75 is below every kernel: reference only.
    ("kimi_k2", "sm75", "bf16", 64, 8,
     {Role.DENSE_PREFILL: "reference", Role.DENSE_DECODE: "reference"}),
]


@pytest.mark.parametrize("model, gpu, fmt, page, tp, expected", CASES)
def test_choices_with_everything_present(model, gpu, fmt, page, tp, expected):
    plan = resolve(model, rt(gpu, kv_format=fmt, page_size=page, tp_size=tp), probe=everything)
    assert {c.role: c.backend for c in plan.roles} == expected
    assert plan.ok and all(c.automatic for c in plan.roles)
    for c in plan.roles:
        statuses = [k.status for k in c.candidates]
        assert statuses.count("taken") == 1
        assert c.reason.startswith(f"{c.backend}: chosen automatically")


# Without fp8mla's kernels, the external kernels' constraints decide (the user's story).
EXTERNAL_CASES = [
    # GLM-5 TP8 on H200: 8 heads per rank -> FlashMLA sparse refuses; DeepGEMM serves indexer.
    ("glm5", "h200", "fp8_ds_mla", 64, 8,
     {Role.SPARSE_PREFILL: "reference", Role.INDEXER: "deepgemm", Role.TOPK: "reference",
      Role.SPARSE_DECODE: "reference"},
     {Role.SPARSE_DECODE: ("flashmla", "num_heads per rank must be 64 or 128, got 8")}),
    # GLM-5 TP1 (64 heads) on H200: FlashMLA serves sparse attention.
    ("glm5", "h200", "fp8_ds_mla", 64, 1,
     {Role.SPARSE_PREFILL: "flashmla", Role.INDEXER: "deepgemm", Role.TOPK: "reference",
      Role.SPARSE_DECODE: "flashmla"}, {}),
    # DeepSeek-V3.2 TP1 (128 heads) on B200, but page size 16: FlashMLA and DeepGEMM refuse.
    ("deepseek_v32", "b200", "fp8_ds_mla", 16, 1,
     {Role.SPARSE_PREFILL: "reference", Role.INDEXER: "reference", Role.TOPK: "reference",
      Role.SPARSE_DECODE: "reference"},
     {Role.SPARSE_DECODE: ("flashmla", "page_size must be 64, got 16"),
      Role.INDEXER: ("deepgemm", "page_size must be 64, got 16")}),
    # Motivating deployment, SM120: FlashMLA / DeepGEMM are SM90/SM100 only.
    ("glm5", "rtx-pro-6000", "fp8_ds_mla", 64, 8,
     dict.fromkeys(DSA_ROLES, "reference"),
     {Role.INDEXER: ("deepgemm", "compute capability must be sm90 or sm100, got sm120")}),
    # Dense model, FP8 pool on H100: FlashMLA / FlashInfer read BF16 only -> gather_cast.
    ("deepseek_v3", "h100", "fp8", 64, 8,
     {Role.DENSE_PREFILL: "reference", Role.DENSE_DECODE: "gather_cast"},
     {Role.DENSE_DECODE: ("flashinfer", "kv_format must be bf16, got fp8")}),
    # Same with a BF16 pool: FlashMLA serves dense decode, FlashInfer dense prefill.
    ("deepseek_v3", "h100", "bf16", 64, 8,
     {Role.DENSE_PREFILL: "flashinfer", Role.DENSE_DECODE: "flashmla"}, {}),
    # B200, fp8 per-tensor: TRT-LLM-gen serves DeepSeek-V3 (qk_nope 128) ...
    ("deepseek_v3", "b200", "fp8", 64, 8,
     {Role.DENSE_PREFILL: "reference", Role.DENSE_DECODE: "flashinfer_trtllm"}, {}),
]


def fp8mla_absent(record):
    return "kernel not implemented in this version" if record.name == "fp8mla" else None


@pytest.mark.parametrize("model, gpu, fmt, page, tp, expected, reasons", EXTERNAL_CASES)
def test_choices_without_fp8mla_kernels(model, gpu, fmt, page, tp, expected, reasons):
    plan = resolve(model, rt(gpu, kv_format=fmt, page_size=page, tp_size=tp),
                   probe=fp8mla_absent)
    assert {c.role: c.backend for c in plan.roles} == expected
    for role, (backend, text) in reasons.items():
        cand = next(k for k in plan.choice(role).candidates if k.backend == backend)
        assert cand.status == "rejected"
        assert any(v.startswith(text) for v in cand.violations), cand.violations
        assert cand.reason.startswith(f"{backend}: ")


def test_trtllm_rejects_glm5_qk_nope():
    plan = resolve("glm5", rt("b200", kv_format="fp8", tp_size=1),
                   {Role.DENSE_DECODE: "gather_cast"}, probe=fp8mla_absent)
    cand = next(k for k in plan.choice("dense_decode").candidates
                if k.backend == "flashinfer_trtllm")
    assert "qk_nope_head_dim must be 128, got 192" in cand.reason


def test_this_version_dsa_falls_to_reference_with_visible_reasons():
    plan = resolve("glm5", rt(), probe=kernels_missing)
    assert plan.ok
    for c in plan.roles:
        assert c.backend == "reference" and c.automatic
        fp8 = c.candidates[0]
        assert fp8.backend == "fp8mla" and fp8.status == "rejected"
    assert any("float32 reference" in w for w in plan.warnings)


def test_dense_prefill_reference_is_visible():
    plan = resolve("deepseek_v3", rt("h200"), probe=nothing_external)
    c = plan.choice(Role.DENSE_PREFILL)
    assert c.backend == "reference"
    assert c.candidates[0].backend == "fp8mla" and c.candidates[0].status == "rejected"
    assert c.candidates[0].reason == f"fp8mla: {NO_DENSE_PREFILL}"


def test_real_probe_reports_missing_fp8mla_sparse_kernel():
    plan = resolve("glm5", rt(), probe=probe_available)
    fp8 = plan.choice("sparse_decode").candidates[0]
    if fp8.status == "rejected":  # until fp8mla.ops.sparse_decode lands
        assert fp8.reason.startswith("fp8mla: sparse_decode kernel not implemented in this version")


def test_explicit_choice_is_marked_and_others_explain():
    plan = resolve("glm5", rt("h200", tp_size=1), {"sparse_decode": "flashmla"}, probe=everything)
    c = plan.choice("sparse_decode")
    assert c.backend == "flashmla" and not c.automatic
    fp8 = next(k for k in c.candidates if k.backend == "fp8mla")
    assert fp8.status == "serves" and "explicitly requested" in fp8.reason


def test_explicit_impossible_raises_with_constraints_and_alternatives():
    with pytest.raises(BackendChoiceError) as ei:
        resolve("glm5", rt("h200", page_size=16), {Role.SPARSE_DECODE: "flashmla"},
                probe=everything)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.role == Role.SPARSE_DECODE and e.backend == "flashmla"
    assert "num_heads per rank must be 64 or 128, got 8 = 64 heads / tp 8" in e.violations[0]
    assert e.violations[1].startswith("page_size must be 64, got 16")
    assert e.alternatives == ["fp8mla", "reference"]
    assert str(e).startswith("sparse_decode_backend: flashmla cannot serve sparse_decode: ")


def test_explicit_backend_without_the_role():
    with pytest.raises(BackendChoiceError, match="does not implement sparse_decode"):
        resolve("glm5", rt(), {Role.SPARSE_DECODE: "deepgemm"}, probe=everything)


def test_explicit_impossible_non_strict_leaves_role_unserved():
    plan = resolve("glm5", rt(), {Role.SPARSE_DECODE: "flashmla"}, strict=False,
                   probe=everything)
    assert not plan.ok and plan.unservable == [Role.SPARSE_DECODE]
    c = plan.choice("sparse_decode")
    assert "backends that would serve: fp8mla, reference" in c.reason


def test_dsa_decode_on_dense_backend_warns():
    plan = resolve("glm5", rt(pool_tokens=495_000), {"dense_decode": "full_cast"},
                   probe=everything)
    assert plan.choice(Role.DENSE_DECODE).backend == "full_cast"
    assert Role.SPARSE_DECODE not in [c.role for c in plan.roles]
    assert any("beyond index_topk=2048" in w and "no longer computes the model's attention" in w
               for w in plan.warnings)


def test_exclude_makes_roles_unservable():
    plan = resolve("glm5", rt(), exclude=["reference"], probe=kernels_missing)
    assert not plan.ok and set(plan.unservable) == set(DSA_ROLES)
    ref = plan.choice("topk").candidates[-1]
    assert ref.violations[0] == "excluded by the user"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(choices={"sparse_decode": "flashmlaa"}), "unknown backend 'flashmlaa'; valid: "),
        (dict(choices={"decode": "fp8mla"}), "role: unknown role 'decode'; valid: "),
        (dict(model="deepseek_v3", choices={"sparse_decode": "fp8mla"}),
         "sparse_decode_backend: deepseek_v3 is a dense MLA model"),
        (dict(choices={"sparse_decode": "fp8mla", "dense_decode": "fp8mla"}), "give only one"),
        (dict(exclude=["nope"]), "exclude: unknown backend 'nope'"),
        (dict(runtime=dict(tp_size=3)), "tp_size: glm5 has 64 heads"),
        (dict(runtime=dict(kv_format="fp4")), "kv_format: expected one of bf16, fp8, fp8_ds_mla"),
        (dict(runtime=dict(page_size=0)), "page_size: expected an int >= 1, got 0"),
        (dict(model="nomodel"), "model: 'nomodel' is neither a preset"),
    ],
)
def test_bad_input(kwargs, match):
    runtime = kwargs.pop("runtime", {})
    model = kwargs.pop("model", "glm5")
    with pytest.raises(ValueError, match=match):
        resolve(model, rt(**runtime), kwargs.pop("choices", None), **kwargs)
