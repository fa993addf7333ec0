"""Backend records and registry: frozen data, cited constraints, lazy availability."""

import dataclasses
import sys

import pytest

from fp8mla.backends import (
    REGISTRY,
    BackendRecord,
    IntSet,
    Problem,
    Role,
    Tier,
    backend_names,
    candidates_for,
    probe_available,
    record_for,
    records_for,
)


def _problem(role=Role.SPARSE_DECODE, **kw):
    base = dict(role=role, kv_format="fp8_ds_mla", num_heads=8, page_size=64, kv_lora_rank=512,
                qk_rope_head_dim=64, qk_nope_head_dim=192, s_q=1, compute_capability=120,
                device="rtx-pro-6000", tp_size=8, index_n_heads=32, index_head_dim=128)
    base.update(kw)
    return Problem(**base)


def test_records_are_frozen_and_cited():
    for r in REGISTRY:
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.name = "x"  # type: ignore[misc]
        assert r.source, f"{r.name} has no source"
        assert r.roles and r.kv_formats
        hash(r)  # usable as dict keys / in sets


def test_registered_names():
    assert backend_names() == sorted(
        ["fp8mla", "flashmla", "flashinfer", "flashinfer_trtllm", "deepgemm", "gather_cast",
         "full_cast", "reference"])
    with pytest.raises(ValueError, match="unknown backend 'nope'.*valid: deepgemm"):
        records_for("nope")


def test_each_name_covers_each_role_at_most_once():
    for name in backend_names():
        seen = [role for r in records_for(name) for role in r.roles]
        assert len(seen) == len(set(seen)), name


def test_reference_serves_every_role_on_cpu():
    ref = records_for("reference")[0]
    assert ref.roles == frozenset(Role) and ref.tier == Tier.REFERENCE
    assert not ref.needs_cuda and not ref.cuda_graph_safe


@pytest.mark.parametrize("role", list(Role))
def test_candidates_in_preference_order(role):
    cands = candidates_for(role)
    tiers = [(c.tier, c.priority) for c in cands]
    assert tiers == sorted(tiers)
    assert cands[-1].name == "reference"
    assert cands[0].name == "fp8mla"


@pytest.mark.parametrize(
    "intset, inside, outside, text",
    [
        (IntSet(), [1, 7, 4096], [0, -1], "any"),
        (IntSet(1, 128), [1, 128], [0, 129], "1-128"),
        (IntSet.of(64), [64], [16, 128], "64"),
        (IntSet.of(64, 128), [64, 128], [8, 32], "64 or 128"),
        (IntSet.powers_of_two(1, 256), [1, 2, 64, 256], [3, 48, 512], "one of 1, 2, 4"),
    ],
)
def test_intset(intset, inside, outside, text):
    assert all(v in intset for v in inside)
    assert not any(v in intset for v in outside)
    assert intset.describe().startswith(text)


@pytest.mark.parametrize(
    "name, role, changes, expected",
    [
        ("flashmla", Role.SPARSE_DECODE, {}, ["num_heads per rank must be 64 or 128, got 8 = "
                                              "64 heads / tp 8",
                                              "compute capability must be sm90 or sm100, got "
                                              "sm120 (rtx-pro-6000)"]),
        ("flashmla", Role.SPARSE_DECODE, dict(num_heads=64, tp_size=1, compute_capability=90,
                                              device="h200", page_size=16),
         ["page_size must be 64, got 16"]),
        ("flashmla", Role.DENSE_DECODE, dict(compute_capability=90),
         ["kv_format must be bf16, got fp8_ds_mla"]),
        ("flashinfer", Role.DENSE_DECODE, dict(kv_format="fp8"),
         ["kv_format must be bf16, got fp8 (FlashInfer's MLA kernels static_assert"]),
        ("flashinfer_trtllm", Role.DENSE_DECODE,
         dict(kv_format="bf16", compute_capability=100),
         ["qk_nope_head_dim must be 128, got 192"]),
        ("deepgemm", Role.INDEXER, dict(compute_capability=90, page_size=32),
         ["page_size must be 64, got 32"]),
        ("deepgemm", Role.INDEXER, dict(compute_capability=90,
                                        index_n_heads=16), ["index_n_heads must be 32 or 64"]),
        ("full_cast", Role.DENSE_DECODE, dict(kv_format="bf16"),
         ["kv_format must be fp8 or fp8_ds_mla, got bf16"]),
        ("fp8mla", Role.SPARSE_DECODE, dict(num_heads=200, tp_size=1),
         ["num_heads per rank must be 1-128, got 200"]),
        ("fp8mla", Role.SPARSE_DECODE, dict(page_size=48), ["page_size must be one of 1, 2"]),
        ("fp8mla", Role.SPARSE_DECODE, dict(s_q=5), ["s_q must be 1-4, got 5"]),
        ("fp8mla", Role.SPARSE_DECODE, dict(compute_capability=75, device="sm75"),
         ["compute capability must be one of sm80"]),
        ("fp8mla", Role.SPARSE_DECODE, dict(kv_lora_rank=256), ["kv_lora_rank must be 512"]),
        ("fp8mla", Role.SPARSE_DECODE, {}, []),
        ("reference", Role.TOPK, dict(page_size=3, compute_capability=75), []),
    ],
)
def test_violations(name, role, changes, expected):
    rec = record_for(name, role)
    got = rec.violations(_problem(role, **changes))
    assert len(got) == len(expected), got
    for g, e in zip(got, expected, strict=True):
        assert g.startswith(e), (g, e)


def test_role_not_implemented_is_a_violation():
    rec = records_for("deepgemm")[0]
    assert rec.violations(_problem(Role.SPARSE_DECODE)) == [
        "does not implement sparse_decode (implements: indexer)"]


def test_probe_external_uses_find_spec_without_importing(monkeypatch):
    rec = record_for("flashmla", Role.SPARSE_DECODE)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert probe_available(rec).startswith("module flash_mla is not installed here")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    assert probe_available(rec) is None
    assert "flash_mla" not in sys.modules


def _fake_ops(tmp_path, monkeypatch, source):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return BackendRecord(name="fp8mla", roles=frozenset({Role.SPARSE_DECODE}),
                         tier=Tier.NATIVE, priority=0, kv_formats=frozenset({"bf16"}),
                         entry_point="fp8mla.ops:sparse_decode")


def test_fp8mla_kernel_probe_reads_source_without_importing(tmp_path, monkeypatch):
    from fp8mla.backends import records as rec_mod

    src = "import torch\nfrom x import y as indexer_logits\ndef dense_decode(q):\n    pass\n"
    _fake_ops(tmp_path, monkeypatch, src)
    assert rec_mod._module_defines("fakepkg.ops", "dense_decode")
    assert rec_mod._module_defines("fakepkg.ops", "indexer_logits")
    assert not rec_mod._module_defines("fakepkg.ops", "sparse_decode")
    assert "fakepkg.ops" not in sys.modules  # torch would have been imported


def test_fp8mla_missing_kernel_reason():
    rec = record_for("fp8mla", Role.SPARSE_DECODE)
    why = probe_available(dataclasses.replace(rec, entry_point="fp8mla.config:no_such_kernel"))
    assert why.startswith("sparse_decode kernel not implemented in this version")


def test_import_is_light():
    code = ("import sys, fp8mla.backends, fp8mla.cost, fp8mla.doctor, fp8mla.cli; "
            "bad = [m for m in ('torch', 'triton', 'flash_mla', 'flashinfer', 'deep_gemm') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    import subprocess

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
