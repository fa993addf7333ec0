"""Named GPUs and compute capabilities: what the resolver and the cost model need to know.

Figures are vendor datasheet numbers for *dense* tensor math (NVIDIA datasheets print the
2:4-sparsity figure first; we halve it) and peak memory bandwidth. Attention and the indexer
are bandwidth-bound at decode, so bandwidth matters most; the rates only decide large-batch,
many-head cases. Each entry cites its source.

Names: ``h100``, ``h200``, ``b200``, ``b300``, ``rtx-pro-6000``, ``rtx-5090``, ``gb10``,
``l40s``, ``a100``, ``a40``, ``a10``, or a compute capability written ``sm90``, ``sm_90``,
``SM120``. A compute capability without a named entry borrows the figures of the table GPU of
that capability with the lowest bandwidth (the table's most conservative; smaller parts of a
capability — an RTX A4000 or RTX 3060 at SM86 — are slower still: name the GPU or read the
bytes); capabilities no table GPU has carry no figures (the cost model then reports bytes and
FLOPs but no times).

GPU detection (`detect_gpu`) never imports torch unless a CUDA driver is present: torch takes
seconds to import, and `fp8mla doctor` must answer in about one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

__all__ = [
    "GPUSpec",
    "GPUS",
    "DEFAULT_GPU",
    "parse_compute_capability",
    "format_cc",
    "resolve_gpu",
    "gpu_for_cc",
    "detect_gpu",
    "valid_gpu_names",
]

#: The motivating deployment's GPU (8× RTX PRO 6000, SM120): doctor's default without a GPU.
DEFAULT_GPU = "rtx-pro-6000"


@dataclass(frozen=True)
class GPUSpec:
    """One GPU (or compute capability) as the cost model sees it.

    ``bandwidth_tbps``: peak DRAM bandwidth, TB/s (10^12 bytes/s). ``bf16_tflops`` /
    ``fp8_tflops``: dense tensor-core rates with float32 accumulation, TFLOPS; ``fp8_tflops`` is
    None where the GPU has no FP8 tensor cores (A100). Figures are None for a bare compute
    capability that no table GPU shares. ``source``: where the figures come from.
    """

    name: str
    compute_capability: int
    bandwidth_tbps: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    source: str
    aliases: tuple[str, ...] = ()

    @property
    def sm(self) -> str:
        """The compute capability as ``smXY`` (``sm120``)."""
        return format_cc(self.compute_capability)

    @property
    def has_figures(self) -> bool:
        """True when bandwidth and the BF16 rate are known (times can be predicted)."""
        return self.bandwidth_tbps is not None and self.bf16_tflops is not None


GPUS: dict[str, GPUSpec] = {
    "h100": GPUSpec(
        "h100", 90, 3.35, 989.4, 1978.9,
        # H100 SXM: 3.35 TB/s; BF16 1,979 and FP8 3,958 TFLOPS "with sparsity" → halved.
        "NVIDIA H100 datasheet (H100 SXM), https://www.nvidia.com/en-us/data-center/h100/",
        aliases=("h100-sxm", "h100-sxm5"),
    ),
    "h200": GPUSpec(
        "h200", 90, 4.8, 989.4, 1978.9,
        # H200 SXM: 4.8 TB/s HBM3e; tensor rates as H100 SXM (1,979 / 3,958 sparse) → halved.
        "NVIDIA H200 datasheet (H200 SXM), https://www.nvidia.com/en-us/data-center/h200/",
        aliases=("h200-sxm",),
    ),
    "b200": GPUSpec(
        "b200", 100, 7.7, 2250.0, 4500.0,
        # HGX B200 (8 GPUs): 62 TB/s HBM3e (DGX B200 says 64 TB/s; we take the lower),
        # BF16 36 PFLOPS and FP8 72 PFLOPS with sparsity → per GPU, dense: 2.25 / 4.5 PFLOPS.
        "NVIDIA HGX B200 specifications, https://www.nvidia.com/en-us/data-center/hgx/",
        aliases=("b200-sxm", "hgx-b200", "gb200"),
    ),
    "b300": GPUSpec(
        "b300", 103, 8.0, 2250.0, 4500.0,
        # HGX B300 (Blackwell Ultra, SM103): 288 GB HBM3e at up to 8 TB/s a GPU; dense tensor
        # rates as B200's (BF16 2,250, FP8 4,500 TFLOPS; its gains are FP4 and attention's
        # exponentials), per the HGX B300 table at https://glennklockwood.com/garden/processors/B300
        "NVIDIA HGX B300 figures, https://www.nvidia.com/en-us/data-center/hgx/ and "
        "https://glennklockwood.com/garden/processors/B300",
        aliases=("b300-sxm", "hgx-b300", "gb300"),
    ),
    "rtx-pro-6000": GPUSpec(
        "rtx-pro-6000", 120, 1.792, 503.8, 1007.6,
        # RTX PRO 6000 Blackwell (workstation/server): 96 GB GDDR7, 512-bit, 1,792 GB/s;
        # "4,000 AI TOPS" = FP4 with sparsity. Dense FP8 = 4000/4 ≈ 1,007.6 and BF16 ≈ 503.8 with
        # FP32 accumulate (professional parts run it at full rate): derived from the AI TOPS
        # figure (188 SMs at ≈2.6 GHz), as NVIDIA prints no dense BF16/FP8 line.
        "NVIDIA RTX PRO 6000 Blackwell datasheet, "
        "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/"
        "rtx-pro-6000/ (dense rates derived from 4,000 AI TOPS, FP4 sparse)",
        aliases=("rtx-pro-6000-blackwell", "rtx6000-pro", "pro6000"),
    ),
    "rtx-5090": GPUSpec(
        "rtx-5090", 120, 1.792, 209.5, 419.0,
        # GeForce RTX 5090: 1,792 GB/s GDDR7. GeForce parts accumulate in FP32 at half rate:
        # FP16/BF16 tensor with FP32 accumulate 209.5 dense, FP8 419 dense (3,352 AI TOPS FP4
        # sparse) per the architecture whitepaper's appendix table.
        "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix (GeForce RTX 5090), "
        "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
        "nvidia-rtx-blackwell-gpu-architecture.pdf",
        aliases=("5090", "geforce-rtx-5090"),
    ),
    "gb10": GPUSpec(
        "gb10", 121, 0.273, 125.0, 250.0,
        # GB10 Grace Blackwell (DGX Spark, SM121): 128 GB LPDDR5x unified at 273 GB/s; "up to
        # 1 petaFLOP" of FP4 with sparsity. Dense FP8 = 1000/4 = 250 and BF16 = 125 derived from
        # it as for the RTX PRO 6000 (NVIDIA prints no dense BF16/FP8 line); decode is bound by
        # the 273 GB/s either way.
        "NVIDIA DGX Spark specifications, https://www.nvidia.com/en-us/products/workstations/"
        "dgx-spark/ (dense rates derived from 1 PFLOP FP4 sparse)",
        aliases=("dgx-spark", "spark"),
    ),
    "l40s": GPUSpec(
        "l40s", 89, 0.864, 362.05, 733.0,
        # L40S: 864 GB/s GDDR6; BF16 362.05 | 733 (sparse), FP8 733 | 1,466 (sparse) TFLOPS.
        "NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/",
    ),
    "a100": GPUSpec(
        "a100", 80, 2.039, 312.0, None,
        # A100 SXM4 80GB: 2,039 GB/s HBM2e; BF16 312 (624 sparse); no FP8 tensor cores.
        "NVIDIA A100 datasheet (A100 80GB SXM), https://www.nvidia.com/en-us/data-center/a100/",
        aliases=("a100-sxm", "a100-80gb"),
    ),
    "a40": GPUSpec(
        "a40", 86, 0.696, 149.7, None,
        # A40: 48 GB GDDR6 at 696 GB/s; BF16 with FP32 accumulate 149.7 | 299.4 (sparse); no FP8
        # tensor cores (SM86: fp8mla converts e4m3 in software there).
        "NVIDIA A40 datasheet, https://www.nvidia.com/en-us/data-center/a40/",
    ),
    "a10": GPUSpec(
        "a10", 86, 0.6, 125.0, None,
        # A10: 24 GB GDDR6 at 600 GB/s; BF16 125 | 250 (sparse) TFLOPS; no FP8 tensor cores.
        "NVIDIA A10 datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
        aliases=("a10g",),
    ),
}

_CC_RE = re.compile(r"^sm_?(\d{2,3})[a-z]?$")
# Patterns (`re.search`) of lowered torch / nvidia-smi device names → table entry, checked in
# order; an entry is taken only where the device's compute capability is its own.
_NAME_HINTS = (
    ("rtx pro 6000", "rtx-pro-6000"),
    ("5090", "rtx-5090"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("b200", "b200"),
    ("b300", "b300"),
    ("gb10", "gb10"),
    ("l40s", "l40s"),
    ("a100", "a100"),
    (r"\ba40\b", "a40"),  # not the RTX A4000
    (r"\ba10g?\b", "a10"),  # A10, A10G; not the A100
)


def format_cc(cc: int) -> str:
    """``120`` → ``"sm120"``."""
    return f"sm{cc}"


def parse_compute_capability(text: str) -> int | None:
    """``"sm90"``, ``"sm_90"``, ``"SM120"``, ``"sm90a"`` → 90 / 120; anything else → None."""
    m = _CC_RE.match(text.strip().lower())
    return int(m.group(1)) if m else None


def valid_gpu_names() -> list[str]:
    """The names `resolve_gpu` accepts (besides ``smXY`` compute capabilities)."""
    return sorted(GPUS)


def gpu_for_cc(cc: int) -> GPUSpec:
    """A spec for a bare compute capability: the figures of the table GPU of that capability
    with the lowest bandwidth, or no figures when the table has none."""
    same = [g for g in GPUS.values() if g.compute_capability == cc]
    if not same:
        return GPUSpec(format_cc(cc), cc, None, None, None,
                       "no table GPU has this compute capability: no figures")
    rep = min(same, key=lambda g: (g.bandwidth_tbps or 0.0, g.fp8_tflops or 0.0))
    return dataclasses.replace(
        rep, name=format_cc(cc), aliases=(),
        source=f"figures of {rep.name} (lowest-bandwidth table GPU of {format_cc(cc)}): "
        f"{rep.source}",
    )


def resolve_gpu(name: str) -> GPUSpec:
    """The `GPUSpec` for a table name, an alias, or a compute capability (``sm120``).

    Raises ValueError listing the valid names for anything else.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"gpu: expected a GPU name or smXY, got {name!r}")
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key in GPUS:
        return GPUS[key]
    for spec in GPUS.values():
        if key in spec.aliases:
            return spec
    cc = parse_compute_capability(name)
    if cc is not None:
        return gpu_for_cc(cc)
    raise ValueError(
        f"gpu: unknown GPU {name!r}; valid: {', '.join(valid_gpu_names())}, or a compute "
        "capability such as sm80, sm90, sm120 (sm_90 also accepted)"
    )


def _spec_from_device(device_name: str, cc: int) -> GPUSpec:
    lowered = device_name.lower()
    for hint, key in _NAME_HINTS:
        if re.search(hint, lowered) and GPUS[key].compute_capability == cc:
            return GPUS[key]
    return dataclasses.replace(gpu_for_cc(cc), name=f"{format_cc(cc)} ({device_name})")


def _driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")


def detect_gpu() -> tuple[GPUSpec | None, str]:
    """The local GPU (device 0) and how it was found, or ``(None, why not)``.

    Order: torch.cuda when torch is already imported; else ``nvidia-smi``; else, only when a
    CUDA driver is present, import torch and ask torch.cuda. On a machine without an NVIDIA
    driver this returns quickly without importing torch.
    """
    torch = sys.modules.get("torch")
    if torch is None and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out and "," in out[0]:
            dev_name, cap = (s.strip() for s in out[0].rsplit(",", 1))
            try:
                major, minor = cap.split(".")
                cc = int(major) * 10 + int(minor)
            except ValueError:
                cc = None
            if cc is not None:
                return _spec_from_device(dev_name, cc), f"detected by nvidia-smi: {dev_name}"
    if torch is None:
        if not _driver_present():
            return None, "no NVIDIA driver found (no nvidia-smi, no /dev/nvidia0)"
        try:
            import torch  # noqa: F811 — lazy: seconds to import, only with a driver present
        except ImportError:
            return None, "torch is not installed, cannot query CUDA"
    if not torch.cuda.is_available():
        return None, "torch.cuda.is_available() is False"
    major, minor = torch.cuda.get_device_capability(0)
    dev_name = torch.cuda.get_device_name(0)
    return _spec_from_device(dev_name, major * 10 + minor), f"detected by torch.cuda: {dev_name}"
