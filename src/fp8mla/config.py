"""Model shapes of MLA / DeepSeek-Sparse-Attention layers.

`MLAConfig` holds what an attention kernel needs to know about one model's attention layer
(docs/DESIGN.md §2, §4). Presets cover GLM-5, DeepSeek-V3.2, DeepSeek-V3/R1 and Kimi-K2;
`from_hf_config` reads a Hugging Face ``config.json``; `MLAConfig.split_tp` gives the per-rank
shape under tensor parallelism (heads split, everything else shared).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MLAConfig", "PRESETS", "preset", "from_hf_config", "resolve_model"]


@dataclass(frozen=True)
class MLAConfig:
    """One model's attention layer, as the kernels see it.

    Dimensions follow the Hugging Face names. ``index_n_heads == 0`` means a dense-MLA model
    (no lightning indexer, no sparse attention).
    """

    name: str
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_layers: int
    hidden_size: int
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    indexer_rope_interleave: bool = False
    indexer_hadamard: bool = False
    yarn_factor: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    yarn_original_max_position: int = 0
    yarn_rope_mscale: float = 0.0  # rope_parameters["mscale"] (0: absent)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_truncate: bool = True

    def __post_init__(self) -> None:
        for field in (
            "num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "num_layers", "hidden_size",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field}: expected a positive int, got {value!r}")
        for field in ("index_n_heads", "index_head_dim", "index_topk"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field}: expected an int >= 0, got {value!r}")
        sparse = (self.index_n_heads, self.index_head_dim, self.index_topk)
        if any(sparse) and not all(sparse):
            raise ValueError(
                "index_n_heads, index_head_dim, index_topk: expected all zero (dense MLA) or all "
                f"positive (DSA), got {sparse}"
            )
        if not (self.rope_theta > 0):
            raise ValueError(f"rope_theta: expected > 0, got {self.rope_theta!r}")
        if not (self.yarn_factor >= 1.0):
            raise ValueError(f"yarn_factor: expected >= 1, got {self.yarn_factor!r}")

    @property
    def is_sparse(self) -> bool:
        """True for DSA models (a lightning indexer picks index_topk tokens per query)."""
        return self.index_topk > 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_dim(self) -> int:
        """Values per cached token: latent + rope (576 for every preset)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def yarn_mscale(self) -> float:
        """YaRN attention-scale factor (DeepSeek: 0.1·mscale_all_dim·ln(factor) + 1; 1 without)."""
        if self.yarn_factor <= 1.0 or self.yarn_mscale_all_dim == 0.0:
            return 1.0
        return 0.1 * self.yarn_mscale_all_dim * math.log(self.yarn_factor) + 1.0

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5 · mscale² (docs/DESIGN.md §2)."""
        return self.qk_head_dim ** -0.5 * self.yarn_mscale ** 2

    def split_tp(self, tp_size: int) -> MLAConfig:
        """The per-rank config under tensor parallelism: query heads split evenly, the latent
        cache and the indexer (which every rank computes whole) unchanged."""
        if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size <= 0:
            raise ValueError(f"tp_size: expected a positive int, got {tp_size!r}")
        if self.num_heads % tp_size:
            raise ValueError(
                f"tp_size: {self.name} has {self.num_heads} heads, which {tp_size} ranks cannot "
                f"split evenly (valid: divisors of {self.num_heads})"
            )
        return dataclasses.replace(self, num_heads=self.num_heads // tp_size)


PRESETS: dict[str, MLAConfig] = {
    "glm5": MLAConfig(
        name="glm5", num_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192,
        qk_rope_head_dim=64, v_head_dim=256, num_layers=78, hidden_size=6144,
        index_n_heads=32, index_head_dim=128, index_topk=2048, rope_theta=1_000_000.0,
        rope_interleave=True, indexer_rope_interleave=True, indexer_hadamard=False,
    ),
    "deepseek_v32": MLAConfig(
        name="deepseek_v32", num_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_layers=61,
        hidden_size=7168, index_n_heads=64, index_head_dim=128, index_topk=2048,
        rope_theta=10000.0, rope_interleave=True, indexer_rope_interleave=False,
        indexer_hadamard=True, yarn_factor=40.0, yarn_mscale_all_dim=1.0,
        yarn_original_max_position=4096, yarn_rope_mscale=1.0,
    ),
    "deepseek_v3": MLAConfig(
        name="deepseek_v3", num_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_layers=61,
        hidden_size=7168, rope_theta=10000.0, rope_interleave=True, yarn_factor=40.0,
        yarn_mscale_all_dim=1.0, yarn_original_max_position=4096, yarn_rope_mscale=1.0,
    ),
    "kimi_k2": MLAConfig(
        name="kimi_k2", num_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, num_layers=61, hidden_size=7168,
        rope_theta=50000.0, rope_interleave=True, yarn_factor=32.0, yarn_mscale_all_dim=1.0,
        yarn_original_max_position=4096, yarn_rope_mscale=1.0,
    ),
}


def preset(name: str) -> MLAConfig:
    """The preset called ``name`` (``glm5``, ``deepseek_v32``, ``deepseek_v3``, ``kimi_k2``)."""
    if name not in PRESETS:
        raise ValueError(f"model: unknown preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


# model_type → (preset whose conventions apply, whether the model has a lightning indexer)
_HF_MODEL_TYPES = {
    "glm_moe_dsa": "glm5",
    "deepseek_v32": "deepseek_v32",
    "deepseek_v3": "deepseek_v3",
    "kimi_k2": "kimi_k2",
}
_REQUIRED = (
    "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "num_hidden_layers", "hidden_size",
)


def _rope_fields(cfg: Mapping[str, Any], default_theta: float) -> dict[str, Any]:
    # transformers ≥ 5 writes `rope_parameters` (theta inside); older files `rope_theta` + `rope_scaling`.
    params = dict(cfg.get("rope_scaling") or {})
    params.update(cfg.get("rope_parameters") or {})
    theta = params.get("rope_theta", cfg.get("rope_theta", default_theta))
    kind = params.get("rope_type", params.get("type", "default"))
    out: dict[str, Any] = {"rope_theta": float(theta)}
    if kind == "yarn":
        out["yarn_factor"] = float(params.get("factor", 1.0))
        out["yarn_mscale_all_dim"] = float(params.get("mscale_all_dim", 0.0) or 0.0)
        out["yarn_original_max_position"] = int(params.get("original_max_position_embeddings", 0))
        out["yarn_rope_mscale"] = float(params.get("mscale", 0.0) or 0.0)
        out["yarn_beta_fast"] = float(params.get("beta_fast", 32.0) or 32.0)
        out["yarn_beta_slow"] = float(params.get("beta_slow", 1.0) or 1.0)
        out["yarn_truncate"] = bool(params.get("truncate", True))
    return out


def from_hf_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> MLAConfig:
    """An `MLAConfig` from a Hugging Face config: a ``config.json`` path, its folder, or a dict.

    Supported model types: glm_moe_dsa, deepseek_v32, deepseek_v3, kimi_k2. Conventions that
    config.json does not spell out (RoPE interleaving, the indexer's Hadamard transform) come
    from the matching preset.
    """
    if isinstance(path_or_dict, Mapping):
        cfg = dict(path_or_dict)
        source = "config dict"
    else:
        path = os.fspath(path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path) as f:
                cfg = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"path_or_dict: no such file {path!r}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"path_or_dict: {path!r} is not valid JSON ({e})") from None
        source = path
    model_type = cfg.get("model_type")
    if model_type not in _HF_MODEL_TYPES:
        raise ValueError(
            f"model_type: expected one of {', '.join(sorted(_HF_MODEL_TYPES))} in {source}, "
            f"got {model_type!r}"
        )
    missing = [k for k in _REQUIRED if k not in cfg]
    base = PRESETS[_HF_MODEL_TYPES[model_type]]
    if base.is_sparse:
        missing += [k for k in ("index_n_heads", "index_head_dim", "index_topk") if k not in cfg]
    if missing:
        raise ValueError(f"{source}: missing required field(s) {', '.join(missing)}")
    fields: dict[str, Any] = dict(
        name=str(cfg.get("_name_or_path") or model_type),
        num_heads=cfg["num_attention_heads"], q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"],
        num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
        rope_interleave=bool(cfg.get("rope_interleave", base.rope_interleave)),
        indexer_rope_interleave=base.indexer_rope_interleave,
        indexer_hadamard=base.indexer_hadamard,
        yarn_factor=1.0, yarn_mscale_all_dim=0.0, yarn_original_max_position=0,
        yarn_rope_mscale=0.0,
    )
    if base.is_sparse:
        fields.update(index_n_heads=cfg["index_n_heads"], index_head_dim=cfg["index_head_dim"],
                      index_topk=cfg["index_topk"])
    fields.update(_rope_fields(cfg, base.rope_theta))
    return MLAConfig(**fields)


def resolve_model(spec: str | os.PathLike | Mapping[str, Any] | MLAConfig) -> MLAConfig:
    """A config from a preset name, a config.json path / folder, a dict, or an `MLAConfig`."""
    if isinstance(spec, MLAConfig):
        return spec
    if isinstance(spec, str) and spec in PRESETS:
        return PRESETS[spec]
    if isinstance(spec, (str, os.PathLike)) and not os.path.exists(spec):
        raise ValueError(
            f"model: {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor an existing "
            "config.json path"
        )
    return from_hf_config(spec)
