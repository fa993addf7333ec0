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
