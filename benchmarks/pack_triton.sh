#!/usr/bin/env bash
# Packs a Triton release for the device, whose Python is 3.12 and which has triton 3.6 and no
# registry: the cp312 wheel, less what kernels never load (the CUPTI profiling libraries, the
# Blackwell ptxas, the instrumentation and profiler libraries, the AMD backend; libtriton's debug symbols
# stripped), as one tar.xz of its `triton/` and dist-info folders under .t38 (ignored by git), small enough to
# travel with the working tree (64 MiB a call; 3.8.0: 894 MB unpacked -> 53 MB; 3.9.0 -> 54 MB).
# `TRITON_TAR=.t38/triton-3.8.0.tar.xz` then makes `gpu_setup` (gpu_common.sh) run on it, with
# TRITON_BACKENDS_IN_TREE=1 (the package's entry points name the AMD backend, not packed).
# Usage: bash benchmarks/pack_triton.sh [VERSION]   (default 3.8.0)
set -euo pipefail
v=${1:-3.8.0}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  -d "$tmp" "triton==$v"
unzip -q "$tmp"/triton-*.whl 'triton/*' 'triton-*.dist-info/*' -d "$tmp/pkg"
t=$tmp/pkg/triton
rm -rf "$t"/backends/nvidia/lib/cupti* "$t"/backends/nvidia/bin/ptxas-blackwell \
  "$t"/instrumentation "$t"/_C/libproton.so "$t"/backends/amd
strip --strip-unneeded "$t"/_C/libtriton.so
mkdir -p .t38
grep -qx "/.t38/" .git/info/exclude 2>/dev/null || echo "/.t38/" >> .git/info/exclude
tar -cJf ".t38/triton-$v.tar.xz" -C "$tmp/pkg" .
ls -l ".t38/triton-$v.tar.xz"
