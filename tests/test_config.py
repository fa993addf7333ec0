"""Model configs: presets, Hugging Face config.json, TP split, bad input."""

import json
import math

import pytest

from fp8mla.config import PRESETS, from_hf_config, preset, resolve_model


def test_presets_match_design_table():
    glm, ds32 = preset("glm5"), preset("deepseek_v32")
    assert (glm.num_heads, glm.qk_nope_head_dim, glm.v_head_dim, glm.index_n_heads) == (64, 192, 256, 32)
    assert (ds32.num_heads, ds32.index_n_heads, ds32.num_layers) == (128, 64, 61)
    assert all(c.kv_dim == 576 for c in PRESETS.values())
    assert glm.softmax_scale == 256 ** -0.5 and glm.is_sparse and not preset("deepseek_v3").is_sparse
    mscale = 0.1 * math.log(40) + 1
    assert ds32.softmax_scale == pytest.approx(192 ** -0.5 * mscale ** 2)


def test_tp_split():
    assert preset("glm5").split_tp(8).num_heads == 8
    assert preset("glm5").split_tp(8).index_n_heads == 32  # the indexer is not split
    with pytest.raises(ValueError, match=r"tp_size: glm5 has 64 heads, which 3 ranks cannot"):
        preset("glm5").split_tp(3)


def _hf(model_type="glm_moe_dsa", **over):
    cfg = {"model_type": model_type, "num_attention_heads": 64, "q_lora_rank": 2048,
           "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
           "v_head_dim": 256, "num_hidden_layers": 78, "hidden_size": 6144,
           "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    cfg.update(over)
    return cfg


def test_from_hf_config_dict_and_path(tmp_path):
    c = from_hf_config(_hf())
    assert c.num_heads == 64 and c.index_topk == 2048 and c.rope_theta == 1e6
    path = tmp_path / "config.json"
    old_style = _hf("deepseek_v3", rope_theta=10000, rope_scaling={
        "type": "yarn", "factor": 40, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096}, qk_nope_head_dim=128)
    del old_style["rope_parameters"]  # transformers < 5 files: rope_theta + rope_scaling
    path.write_text(json.dumps(old_style))
    d = from_hf_config(tmp_path)  # a folder works too
    assert d.yarn_factor == 40 and not d.is_sparse
    assert resolve_model(str(path)).softmax_scale == pytest.approx(preset("deepseek_v3").softmax_scale)


def test_hf_config_errors_name_the_field():
    bad = _hf()
    del bad["index_topk"]
    with pytest.raises(ValueError, match=r"missing required field\(s\) index_topk"):
        from_hf_config(bad)
    with pytest.raises(ValueError, match=r"model_type: expected one of .* got 'llama'"):
        from_hf_config(_hf("llama"))
    with pytest.raises(ValueError, match=r"model: 'glm6' is neither a preset"):
        resolve_model("glm6")
    with pytest.raises(ValueError, match=r"num_heads: expected a positive int, got 0"):
        from_hf_config(_hf(num_attention_heads=0))
