"""Drop-in replacements for the FlashMLA and DeepGEMM-indexer Python APIs (fp8mla kernels
behind the same signatures): ``fp8mla.compat.flash_mla``, ``fp8mla.compat.deep_gemm``."""
