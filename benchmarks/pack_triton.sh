#!/usr/bin/env bash
# Packs a Triton release for the device, whose Python is 3.12 and which has triton 3.6 and no
# registry: the cp312 wheel less what kernels on a Hopper GPU never load (the CUPTI profiling
# libraries, the ptxas Hopper does not use, the instrumentation and profiler libraries, the AMD
# backend; libtriton's debug symbols stripped), as one tar.xz of its `triton/` and dist-info
# folders under .t38 (ignored by git), small enough to travel with the working tree (64 MiB a
# call; 3.8.0: 894 MB unpacked -> 53 MB). `TRITON_TAR=.t38/triton-3.8.0.tar.xz` then makes
# `gpu_setup` (gpu_common.sh) run on it, with TRITON_BACKENDS_IN_TREE=1 (the package's entry
# points name the AMD backend, not packed).
# Usage: bash benchmarks/pack_triton.sh [VERSION]   (default 3.8.0)
set -euo pipefail
v=${1:-3.8.0}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  -d "$tmp" "triton==$v"
unzip -q "$tmp"/triton-*.whl 'triton/*' 'triton-*.dist-info/*' -d "$tmp/pkg"
t=$tmp/pkg/triton
rm -rf "$t"/backends/nvidia/lib/cupti* "$t"/instrumentation "$t"/_C/libproton.so \
  "$t"/backends/amd
# one ptxas: the one that compiles for Hopper — `ptxas` (CUDA 12.8 / 12.9) up to 3.8,
# `ptxas-blackwell` (CUDA 13) from 3.9, which takes it for every arch >= 90 (`get_ptxas` in its
# nvidia backend); the other name points at it
bin=$t/backends/nvidia/bin
if grep -q "arch < 90" "$t"/backends/nvidia/compiler.py; then
  ln -sf ptxas-blackwell "$bin"/ptxas
else
  ln -sf ptxas "$bin"/ptxas-blackwell
fi
strip --strip-unneeded "$t"/_C/libtriton.so
mkdir -p .t38
grep -qx "/.t38/" .git/info/exclude 2>/dev/null || echo "/.t38/" >> .git/info/exclude
tar -cJf ".t38/triton-$v.tar.xz" -C "$tmp/pkg" .
ls -l ".t38/triton-$v.tar.xz"
