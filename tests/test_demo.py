"""The demo runs end to end (small configuration) and the attention baselines compute what the
native path computes."""

import json

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
