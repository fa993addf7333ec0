"""Cost model: byte and FLOP counts checked by hand, roofline times, GPU table."""

import pytest

from fp8mla.backends import Role, Runtime, resolve
from fp8mla.config import preset
from fp8mla.cost import KV_ROW_BYTES, cast_bytes, plan_cost, role_cost, roofline_time
from fp8mla.gpus import GPUS, format_cc, gpu_for_cc, parse_compute_capability, resolve_gpu


def everything(record):
    return None


GLM5_TP8 = preset("glm5").split_tp(8)


def rt(gpu="rtx-pro-6000", **kw):
    kw.setdefault("tp_size", 8)
    return Runtime(gpu=resolve_gpu(gpu), **kw)


def test_full_pool_cast_bytes():
    assert cast_bytes(495_000) == 855_360_000  # 495,000 x 576 x 3: the 855 MB per layer


def test_row_bytes_match_design():
    assert KV_ROW_BYTES == {"bf16": 1152, "fp8": 576, "fp8_ds_mla": 656}


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8_ds_mla"])
def test_dense_decode_bytes_and_flops(fmt):
    c = role_cost(Role.DENSE_DECODE, "fp8mla", GLM5_TP8, rt(kv_format=fmt, batch=2, context=4096))
    rows = {"bf16": 1152, "fp8": 576, "fp8_ds_mla": 656}[fmt]
    assert dict(c.breakdown) == {"kv_rows": 2 * 4096 * rows, "q": 2 * 8 * 576 * 2,
                                 "out": 2 * 8 * 512 * 2}
    assert c.bytes == sum(dict(c.breakdown).values())
    assert c.flops == 2 * 8 * 4096 * (576 + 512) * 2


def test_sparse_decode_reads_topk_rows_per_query():
    c = role_cost(Role.SPARSE_DECODE, "fp8mla", GLM5_TP8, rt(batch=64, s_q=2, context=32768))
    assert c.tokens == 2048
    assert dict(c.breakdown)["kv_rows"] == 64 * 2 * 2048 * 656
    assert c.flops == 2 * 8 * 2048 * 1088 * 64 * 2
    short = role_cost(Role.SPARSE_DECODE, "fp8mla", GLM5_TP8, rt(context=1000))
    assert short.tokens == 1000  # fewer cached tokens than index_topk


def test_full_and_gather_cast_bytes():
    full = role_cost(Role.DENSE_DECODE, "full_cast", GLM5_TP8, rt(pool_tokens=495_000))
    parts = dict(full.breakdown)
    assert parts["cast_pool"] == 855_360_000
    assert parts["kv_rows"] == 4096 * 1152  # BF16 attention after the cast
    gather = role_cost(Role.DENSE_DECODE, "gather_cast", GLM5_TP8, rt(batch=3))
    assert dict(gather.breakdown)["cast_gathered"] == 3 * 4096 * 576 * 3


def test_indexer_and_topk_bytes():
    glm = preset("glm5")  # indexer heads are not split by TP
    idx = role_cost(Role.INDEXER, "fp8mla", GLM5_TP8, rt(batch=64, context=32768))
    assert dict(idx.breakdown) == {"index_keys": 64 * 32768 * 132, "q": 64 * 32 * 128,
                                   "weights": 64 * 32 * 4, "logits_out": 64 * 32768 * 4}
    assert idx.flops == 2 * glm.index_n_heads * 128 * 32768 * 64
    top = role_cost(Role.TOPK, "fp8mla", GLM5_TP8, rt(batch=64, context=32768))
    assert dict(top.breakdown) == {"logits_in": 64 * 32768 * 4, "indices_out": 64 * 2048 * 4}
    assert top.flops == 0
    assert role_cost(Role.SPARSE_PREFILL, "fp8mla", GLM5_TP8, rt()) is None


def test_roofline():
    h200 = resolve_gpu("h200")
    t, bound = roofline_time(4_800_000, 0, h200)
    assert t == pytest.approx(1e-6) and bound == "bandwidth"
    t, bound = roofline_time(0, 989_400_000_000, h200)
    assert t == pytest.approx(1e-3) and bound == "compute"
    t, _ = roofline_time(0, 1_978_900_000_000, h200, fp8=True)
    assert t == pytest.approx(1e-3)
    t, _ = roofline_time(0, 312e12, resolve_gpu("a100"), fp8=True)  # no FP8: BF16 rate
    assert t == pytest.approx(1.0)
    assert roofline_time(1, 1, gpu_for_cc(75)) == (None, None)


def test_motivating_deployment_full_cast_costs_tens_of_ms():
    """GLM-5 TP8 on RTX PRO 6000, 495K pool, B=1 ctx=4096: full_cast is tens of ms per step."""
    plan = resolve("glm5", rt(pool_tokens=495_000, batch=1, context=4096),
                   {"dense_decode": "full_cast"}, probe=everything)
    cost = plan_cost(plan)
    assert cost.num_layers == 78
    dd = next(c for c in cost.roles if c.role == Role.DENSE_DECODE)
    per_step_cast = dd.time_s * 78
    assert 0.010 < per_step_cast < 0.100
    assert 0.010 < cost.per_step_s < 0.100
    warn = next(w for w in cost.warnings if w.startswith("full_cast casts the whole 495,000"))
    assert "855.4 MB per layer" in warn and "ms per decode step over 78 layers" in warn
    # the same step with fp8mla's sparse kernels: more than 50x cheaper.
    fast = plan_cost(resolve("glm5", rt(pool_tokens=495_000), probe=everything))
    assert fast.per_step_s * 50 < cost.per_step_s
    assert {c.role for c in fast.roles} == {Role.INDEXER, Role.TOPK, Role.SPARSE_DECODE}


def test_unserved_role_makes_cost_incomplete():
    plan = resolve("glm5", rt(), exclude=["reference"],
                   probe=lambda r: "missing" if r.entry_point else None)
    cost = plan_cost(plan)
    assert not cost.complete and cost.roles == ()


@pytest.mark.parametrize("name", sorted(GPUS))
def test_gpu_table_is_cited_and_sane(name):
    g = GPUS[name]
    assert g.source and ("nvidia.com" in g.source)
    assert 0.2 < g.bandwidth_tbps < 10 and 100 < g.bf16_tflops < 5000
    assert g.fp8_tflops is None or g.fp8_tflops >= g.bf16_tflops
    assert resolve_gpu(name.upper()) is g


@pytest.mark.parametrize(
    "text, cc", [("sm80", 80), ("sm_90", 90), ("SM120", 120), ("sm90a", 90), ("sm100", 100),
                 ("h200", None), ("sm", None), ("90", None)])
def test_parse_compute_capability(text, cc):
    assert parse_compute_capability(text) == cc


def test_cc_names_borrow_conservative_figures():
    assert resolve_gpu("sm90").bandwidth_tbps == GPUS["h100"].bandwidth_tbps
    assert resolve_gpu("sm_120").compute_capability == 120
    assert resolve_gpu("sm120").bf16_tflops == GPUS["rtx-5090"].bf16_tflops
    assert resolve_gpu("sm86").bandwidth_tbps == GPUS["a10"].bandwidth_tbps  # A10, not A40
    assert resolve_gpu("sm87").bandwidth_tbps is None and format_cc(87) == "sm87"


def test_newer_and_sm86_gpus_by_name_alias_and_device_name():
    """B300 (SM103), GB10 (SM121, DGX Spark), A40 and A10 (SM86) have entries of their own: by
    name, alias and the device name torch or nvidia-smi reports (an RTX A4000 is not an A40);
    a bare sm103 / sm121 / sm86 takes their figures."""
    from fp8mla.gpus import _spec_from_device

    assert resolve_gpu("dgx-spark") is GPUS["gb10"] and resolve_gpu("GB300") is GPUS["b300"]
    assert _spec_from_device("NVIDIA B300 SXM6 AC", 103) is GPUS["b300"]
    assert _spec_from_device("NVIDIA GB10", 121) is GPUS["gb10"]
    assert resolve_gpu("sm103").bandwidth_tbps == 8.0 and resolve_gpu("sm_121").bandwidth_tbps == 0.273
    assert _spec_from_device("NVIDIA A10G", 86) is GPUS["a10"]
    assert _spec_from_device("NVIDIA A40", 86) is GPUS["a40"] and _spec_from_device(
        "A40", 86) is GPUS["a40"] and resolve_gpu("gb200") is GPUS["b200"]
    assert _spec_from_device("NVIDIA RTX A4000", 86).name == "sm86 (NVIDIA RTX A4000)"


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(ValueError, match=r"gpu: unknown GPU 'h300'; valid: a10, a100, a40, b200, "
                                         r"b300, gb10, h100"):
        resolve_gpu("h300")
