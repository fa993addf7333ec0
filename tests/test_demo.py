"""The demo runs end to end (small configuration) and the attention baselines compute what the
native path computes."""

import json

import pytest
import torch

from fp8mla.demo import DemoConfig, build, decode_step


def test_baselines_match_native(device):
    dc = DemoConfig(layers=2, batch=2, context=20, pool_tokens=512, page_size=16, small=True)
    _, layers, kv, ic, table, hidden = build(dc, device)
    outs = {}
    for mode in ("native", "gather_cast", "full_cast"):
        for layer in layers:
            layer.attn_mode = mode
        outs[mode] = decode_step(layers, kv, ic, table, hidden, dc.context).float()
    for mode in ("gather_cast", "full_cast"):
        rel = (outs[mode] - outs["native"]).norm() / (outs["native"] - hidden.float()).norm()
        assert rel < 2e-2, (mode, float(rel))


def test_demo_cli_small(tmp_path, capsys):
    from fp8mla.cli import main

    assert main(["demo", "--layers", "1", "--context", "16", "--pool-tokens", "256",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "MLP/MoE is out of scope" in out
    if not torch.cuda.is_available():
        assert "Triton interpreter" in out
    rows = json.loads((tmp_path / "demo.json").read_text())["rows"]
    assert [r["backend"] for r in rows] == ["fp8mla", "gather_cast", "full_cast"]
    assert rows[0]["cast_share"] == 0.0 and rows[2]["cast_share"] > 0.0


def test_demo_records_follow_the_results_format(tmp_path, monkeypatch):
    """On a GPU the demo also writes docs/DESIGN.md §9 records (case, backend, µs, ceiling, ...)."""
    import json

    from fp8mla import demo
    from fp8mla.bench import harness

    monkeypatch.setattr(harness, "read_ceiling_tbps", lambda: 4.4)
    monkeypatch.setattr(harness, "env_info", lambda: dict(gpu="g", torch="t", triton="x",
                                                          date="d", commit="c"))
    rows = [{"backend": "fp8mla", "us_per_step": 7320.0, "tokens_per_s": 136.6,
             "timed": "CUDA graph", "cast_share": 0.0}]
    path = tmp_path / "records.json"
    demo._write_records(demo.DemoConfig(layers=78, batch=1, context=4096, pool_tokens=495_000),
                        rows, str(path))
    (rec,) = json.loads(path.read_text())
    assert rec["case"] == "demo/glm5-78layers/B1-ctx4096-pool495000"
    assert rec["backend"] == "fp8mla" and rec["us"] == 7320.0 and rec["ceiling_TBps"] == 4.4
    assert {"TBps", "TFLOPS", "gpu", "torch", "triton", "date", "commit"} <= rec.keys()


@pytest.mark.parametrize("argv, message", [
    (["--layers", "0"], "--layers: expected an int >= 1, got 0"),
    (["--batch", "0"], "--batch: expected an int >= 1, got 0"),
    (["--context", "-3"], "--context: expected an int >= 1, got -3"),
    (["--batch", "64"], "--pool-tokens: 64 request(s) of 48 + 1 tokens need 64 pages of 64; "
                        "a pool of 2048 tokens has 32"),
    (["--context", "5000", "--pool-tokens", "4096"], "need 79 pages of 64; a pool of 4096 "
                                                     "tokens has 64"),
    (["--backends", "fp8mla,flashinfer"], "--backends: expected some of fp8mla, gather_cast, "
                                          "full_cast, got 'fp8mla,flashinfer'"),
    (["--backends", ","], "--backends: expected some of"),
])
def test_demo_refuses_bad_options_before_building_anything(argv, message, tmp_path, capsys,
                                                           monkeypatch):
    """Each bad option: exit status 2 and one line naming it, before any layer or cache is
    built (the CPU defaults: 2 layers, context 48, a 2048-token pool)."""
    from fp8mla import demo
    from fp8mla.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(demo, "build", lambda *a: pytest.fail("built despite a bad option"))
    assert main(["demo", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fp8mla demo: error: ") and message in err, err
    assert not (tmp_path / "demo.json").exists()


def test_demo_defaults_by_device():
    import argparse

    from fp8mla.demo import demo_config

    args = argparse.Namespace(layers=None, batch=1, context=None, pool_tokens=None,
                              kv_format="fp8")
    gpu, cpu = demo_config(args, True), demo_config(args, False)
    assert (gpu.layers, gpu.context, gpu.pool_tokens, gpu.small) == (78, 4096, 495_000, False)
    assert (cpu.layers, cpu.context, cpu.pool_tokens, cpu.small) == (2, 48, 2048, True)
    assert gpu.kv_format == cpu.kv_format == "fp8"
