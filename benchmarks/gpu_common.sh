# Sourced by the gpu_*.sh scripts: `gpu_setup NAME` makes $W = $OUT/NAME with the GPU, driver,
# clocks, torch/triton versions and Triton's ptxas in $W/gpu.txt, and $PYTEST_N the GPU tests'
# xdist flag;
# `run NAME TIMEOUT COMMAND...` logs the command to $W/NAME.log (progress bars dropped), its
# exit status and seconds to $W/status.txt, and prints the log's last $TAIL_LINES lines
# (default 3; 0: none). With TRITON_TAR (a package from benchmarks/pack_triton.sh, carried), the
# runs import that Triton instead of the device's, unpacked once a machine under /tmp.
gpu_setup() {
  if ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "$(basename "$0"): needs a CUDA GPU and a torch that sees it (none found)" >&2
    exit 2  # (sourced by the gpu_*.sh scripts: ends the script before any step runs)
  fi
  OUT=${OUT:-.out}; W=$OUT/$1; mkdir -p "$W"
  local site=""
  if [ -n "${TRITON_TAR:-}" ]; then
    site=/tmp/$(basename "$TRITON_TAR" .tar.xz)
    [ -d "$site/triton" ] || { mkdir -p "$site" && tar -xJf "$TRITON_TAR" -C "$site"; } || return
    site=$site:
    export TRITON_BACKENDS_IN_TREE=1  # its backends by folder: the AMD one is not packed
  fi
  export PYTHONPATH=$site$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv > "$W/gpu.txt"
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$W/gpu.txt"
  # the ptxas Triton assembles this GPU's kernels with (3.9 takes CUDA 13's for sm_90, 3.6–3.8
  # CUDA 12's: its code and the hazards it has differ, triton#11781)
  python3 -c "import re, torch; from triton.backends.nvidia.compiler import get_ptxas_version
c = torch.cuda.get_device_capability()
print('ptxas', re.search(r'V[0-9.]+', get_ptxas_version(10 * c[0] + c[1])).group())" \
    >> "$W/gpu.txt" 2>&1
  # the GPU tests in four processes where pytest-xdist is installed (compiling dominates: the
  # suite took 117 s so on the H200 in session 22, and over 250 s in one process)
  PYTEST_N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
}
run() {
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" 2>&1 | grep -v "it/s]" > "$W/$name.log"
  echo "$name rc=${PIPESTATUS[0]} seconds=$((SECONDS - t0))" | tee -a "$W/status.txt"
  if [ "${TAIL_LINES:-3}" -gt 0 ]; then tail -n "${TAIL_LINES:-3}" "$W/$name.log"; fi
}
