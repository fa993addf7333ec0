"""fp8mla: portable Triton kernels for MLA / DeepSeek Sparse Attention over FP8 KV caches."""

from fp8mla.config import MLAConfig, from_hf_config, preset

__version__ = "0.1.0"
__all__ = ["MLAConfig", "from_hf_config", "preset", "__version__"]
