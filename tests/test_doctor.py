"""`fp8mla doctor`: plan table, JSON schema, exit statuses, bad input, speed."""

import json
import subprocess
import sys

import pytest

from fp8mla import doctor
from fp8mla.cli import main


@pytest.fixture(autouse=True)
def no_local_gpu(monkeypatch):
    monkeypatch.setattr(doctor, "detect_gpu", lambda: (None, "no NVIDIA driver found (test)"))


def run(capsys, *argv):
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    return code, (json.loads(out) if out else None), err


def test_defaults_are_the_motivating_deployment(capsys):
    code, rep, _ = run_json(capsys)
    assert code == 0 and rep["ok"]
    assert rep["model"]["name"] == "glm5" and rep["model"]["num_heads_per_rank"] == 8
    assert rep["runtime"] == {"kv_format": "fp8_ds_mla", "page_size": 64, "tp_size": 8,
                              "s_q": 1, "pool_tokens": 495000, "batch": 1, "context": 4096}
    g = rep["gpu"]
    assert g["name"] == "rtx-pro-6000" and g["origin"] == "default"
    assert "motivating deployment" in g["why"] and "no NVIDIA driver" in g["why"]
    assert [p["role"] for p in rep["plan"]] == ["sparse_prefill", "indexer", "topk",
                                                "sparse_decode"]


def _is(value, types):
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in
                                               (types if isinstance(types, tuple) else (types,)))


SCHEMA = {
    "schema_version": int, "ok": bool, "model": dict, "gpu": dict, "runtime": dict,
    "plan": list, "unservable": list, "cost": dict, "warnings": list,
}
MODEL = {"name": str, "source": str, "is_sparse": bool, "num_heads": int,
         "num_heads_per_rank": int, "kv_lora_rank": int, "qk_rope_head_dim": int,
         "qk_nope_head_dim": int, "num_layers": int, "index_n_heads": int,
         "index_head_dim": int, "index_topk": int}
GPU = {"name": str, "compute_capability": str, "bandwidth_TBps": (float, type(None)),
       "bf16_TFLOPS": (float, type(None)), "fp8_TFLOPS": (float, type(None)), "origin": str,
       "why": str, "source": str}
PLAN = {"role": str, "backend": (str, type(None)), "automatic": bool,
        "cuda_graph_safe": (bool, type(None)), "reason": str, "candidates": list}
CAND = {"backend": str, "status": str, "violations": list, "reason": str}
COST = {"roles": list, "num_layers": int, "per_layer_us": (float, type(None)),
        "per_step_ms": (float, type(None)), "complete": bool, "note": str}
ROLE_COST = {"role": str, "backend": str, "tokens": int, "bytes": int, "flops": int,
             "time_us": (float, type(None)), "bound": (str, type(None)), "breakdown": dict}


def check(obj, spec, where):
    assert set(obj) == set(spec), f"{where}: keys {sorted(obj)} != {sorted(spec)}"
    for key, types in spec.items():
        assert _is(obj[key], types), f"{where}.{key}: {obj[key]!r} is not {types}"


@pytest.mark.parametrize("argv", [
    (), ("--model", "deepseek_v3", "--gpu", "h200", "--kv-format", "fp8"),
    ("--dense-decode-backend", "full_cast"), ("--exclude", "reference"),
    ("--gpu", "sm86", "--model", "kimi_k2", "--kv-format", "bf16"),
])
def test_json_schema(capsys, argv):
    _, rep, _ = run_json(capsys, *argv)
    check(rep, SCHEMA, "report")
    assert rep["schema_version"] == doctor.SCHEMA_VERSION == 1
    check(rep["model"], MODEL, "model")
    check(rep["gpu"], GPU, "gpu")
    check(rep["cost"], COST, "cost")
    for p in rep["plan"]:
        check(p, PLAN, "plan[]")
        assert p["candidates"], p["role"]
        for c in p["candidates"]:
            check(c, CAND, "candidates[]")
            assert c["status"] in ("taken", "serves", "rejected")
            assert all(isinstance(v, str) for v in c["violations"])
            assert (c["status"] == "rejected") == bool(c["violations"])
    for r in rep["cost"]["roles"]:
        check(r, ROLE_COST, "cost.roles[]")
        assert sum(r["breakdown"].values()) == r["bytes"]
    assert all(isinstance(w, str) for w in rep["warnings"])
    assert rep["ok"] == (rep["unservable"] == [])


def test_full_cast_cost_visible(capsys):
    code, rep, _ = run_json(capsys, "--gpu", "rtx-pro-6000", "--dense-decode-backend",
                            "full_cast")
    assert code == 0
    dd = next(p for p in rep["plan"] if p["role"] == "dense_decode")
    assert dd["backend"] == "full_cast" and dd["automatic"] is False
    cost = next(r for r in rep["cost"]["roles"] if r["role"] == "dense_decode")
    assert cost["breakdown"]["cast_pool"] == 855_360_000
    assert 10 < cost["time_us"] * 78 / 1000 < 100  # tens of ms per step over 78 layers
    assert any("no longer computes the model's attention" in w for w in rep["warnings"])
    assert any("855.4 MB per layer" in w for w in rep["warnings"])


def test_human_output(capsys):
    code, out, _ = run(capsys, "--gpu", "h200", "--page-size", "16", "--dense-decode-backend",
                       "full_cast")
    assert code == 0
    for text in ("PLAN", "CANDIDATES", "DECODE STEP COST", "WARNINGS", "per decode step",
                 "full_cast    explicit", "automatic",
                 "page_size must be 64, got 16 (FlashMLA checks page_block_size == 64)",
                 "num_heads per rank must be 64 or 128, got 8 = 64 heads / tp 8",
                 "gpu     h200 (sm90), named: --gpu h200", "OK: every role is served"):
        assert text in out, text


def test_unservable_role_exits_1(capsys):
    code, rep, _ = run_json(capsys, "--exclude", "reference,full_cast,gather_cast")
    fp8mla_missing = any(c["backend"] == "fp8mla" and c["status"] == "rejected"
                         for p in rep["plan"] for c in p["candidates"])
    if fp8mla_missing:  # this version: no sparse kernels on SM120 without the reference
        assert code == 1 and not rep["ok"] and rep["unservable"]
    code, out, _ = run(capsys, "--exclude", "reference")
    assert ("NOT SERVABLE" in out) == (code == 1)


def test_explicit_impossible_choice_exits_1_with_reasons(capsys):
    code, rep, _ = run_json(capsys, "--gpu", "h200", "--sparse-decode-backend", "flashmla")
    assert code == 1 and rep["unservable"] == ["sparse_decode"]
    sd = next(p for p in rep["plan"] if p["role"] == "sparse_decode")
    assert sd["backend"] is None and sd["automatic"] is False
    assert "num_heads per rank must be 64 or 128, got 8" in sd["reason"]
    assert "backends that would serve:" in sd["reason"] and "reference" in sd["reason"]


@pytest.mark.parametrize("argv, match", [
    (("--model", "glm6"), "model: 'glm6' is neither a preset (deepseek_v3, deepseek_v32, glm5"),
    (("--gpu", "h300"), "gpu: unknown GPU 'h300'; valid: a10, a100, a40, b200, b300, gb10, h100, h200, l40s"),
    (("--kv-format", "fp4"), "kv_format: expected one of bf16, fp8, fp8_ds_mla, got 'fp4'"),
    (("--sparse-decode-backend", "flash"), "sparse_decode_backend: unknown backend 'flash'; "
                                           "valid: deepgemm, "),
    (("--tp", "3"), "tp_size: glm5 has 64 heads, which 3 ranks cannot split evenly"),
    (("--model", "deepseek_v3", "--indexer-backend", "fp8mla"),
     "indexer_backend: deepseek_v3 is a dense MLA model"),
    (("--context", "0"), "context: expected an int >= 1, got 0"),
    (("--exclude", "nope"), "exclude: unknown backend 'nope'"),
])
def test_bad_arguments_exit_2(capsys, argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("fp8mla doctor: error: ") and match in err, err


def test_config_json(capsys, tmp_path):
    cfg = {"model_type": "glm_moe_dsa", "num_attention_heads": 64, "q_lora_rank": 2048,
           "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
           "v_head_dim": 256, "num_hidden_layers": 78, "hidden_size": 6144,
           "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, rep, _ = run_json(capsys, "--model", str(path))
    assert code == 0 and rep["model"]["source"] == str(path)
    assert rep["model"]["qk_nope_head_dim"] == 192 and rep["model"]["is_sparse"]
    del cfg["index_topk"]
    path.write_text(json.dumps(cfg))
    code, _, err = run(capsys, "--model", str(path))
    assert code == 2 and "missing required field(s) index_topk" in err


def test_argparse_type_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["doctor", "--page-size", "sixty-four"])
    assert ei.value.code == 2


def test_runs_fast_without_heavy_imports():
    code = ("import sys, time; t = time.perf_counter(); from fp8mla.cli import main; "
            "import io, contextlib; buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf): rc = main(['doctor', '--json', '--gpu', "
            "'h200'])\n"
            "heavy = [m for m in ('torch', 'triton') if m in sys.modules]\n"
            "print(rc, heavy, time.perf_counter() - t)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    rc, heavy, seconds = res.stdout.split(" ", 2)[0], res.stdout, res.stdout.split()[-1]
    assert rc == "0", res.stderr
    assert "[]" in heavy, heavy  # neither torch nor triton imported
    assert float(seconds) < 1.0


def test_warns_of_a_triton_that_changes_the_kernels(capsys, monkeypatch):
    """Triton 3.8 stages the fp8 decode tiles through shared memory, older ones are refused
    (RELIABILITY.md): the doctor says so before anything loads; 3.6, 3.7, 3.9 add nothing."""
    from fp8mla import doctor

    for version, start in (("3.8.0", "triton 3.8.0 keeps the dense decode kernel's fp8 tiles"),
                           ("3.5.1", "triton 3.5.1 is older than fp8mla needs (triton >= 3.6"),
                           (None, "triton is not installed"), ("3.9.0", None),
                           ("3.6.0", None), ("3.10.0+git1", None)):
        monkeypatch.setattr(doctor, "_triton_version", lambda v=version: v)
        _, rep, _ = run_json(capsys, "--gpu", "rtx-pro-6000")
        hits = [w for w in rep["warnings"] if w.startswith("triton ")]
        assert hits == ([] if start is None else [hits[0]]), (version, hits)
        assert start is None or hits[0].startswith(start)
    assert doctor._triton_version() is not None  # the installed one, read without importing it
