#!/usr/bin/env bash
# Per-kernel load census of the CUDA kernels, from the PTX NVRTC makes and
# the SASS ptxas assembles (no GPU needed; same wheels as
# scripts/check-cuda-kernels.sh):
#
#   file  kernel  params  ld.global.nc  ld.global  st.global  registers  spill_bytes
#
# `params` counts the kernel's PTX parameters (a by-value struct is one),
# `ld.global.nc` the read-only-cache loads (what `__restrict__` const
# parameters or `__ldg` give), `ld.global` every other global load, all
# in the kernel's own body (inlined helpers included, `.func` bodies not).
# Compare two trees by running it on each and diffing the output: a kernel
# whose parameters moved into a struct must keep its `.nc` count, spill
# nothing new and stay within a few registers.
#
# usage: scripts/ptx-loads.sh [PTX_DIR]
#   PTX_DIR: already compiled PTX (compile_kernels' output); without it the
#   kernels of this tree are compiled into a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_PIN="nvidia-cuda-nvrtc-cu12==12.9.86"
NVCC_PIN="nvidia-cuda-nvcc-cu12==12.9.86"
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -m pip show nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12 >/dev/null 2>&1; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$NVRTC_PIN" "$NVCC_PIN"
fi
site="$(.venv/bin/python -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
[ -x "$ptxas" ] || { echo "ERROR: ptxas missing at $ptxas" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
dir="${1:-}"
if [ -z "$dir" ]; then
  dir="$tmp/ptx"
  LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo run --quiet --locked -p redlite-cuda --example compile_kernels -- "$dir" >/dev/null
fi
ls "$dir"/*.ptx >/dev/null 2>&1 || { echo "ERROR: no .ptx files in $dir" >&2; exit 1; }

printf 'file\tkernel\tparams\tld.global.nc\tld.global\tst.global\tregisters\tspill_bytes\n'
for p in "$dir"/*.ptx; do
  f="$(basename "$p" .ptx)"
  # registers and spill bytes (stores + loads) per entry, from ptxas -v.
  "$ptxas" -arch=sm_90 -v "$p" -o "$tmp/x.cubin" 2>&1 |
    awk '/Compiling entry function/ {k=$7; gsub(/[\047]/, "", k)}
         /spill stores/ && k != "" {s=$5 + $9}
         /Used [0-9]+ registers/ && k != "" {print k, $5, s; k=""}' >"$tmp/regs"
  # loads per entry: a region runs from `.entry name(` to the next
  # `.entry`/`.func`; the parameter list is the lines up to the first `)`.
  awk -v f="$f" -v regs="$tmp/regs" '
    BEGIN { while ((getline l < regs) > 0) { split(l, a, " "); r[a[1]] = a[2]; sp[a[1]] = a[3] } }
    function flush() {
      if (name != "") printf "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", f, name, np, nc, ld, st, r[name], sp[name]
      name = ""
    }
    /^\.(visible \.)?entry / || /^\.func/ {
      flush()
      if ($0 ~ /\.entry/) { name = $3; sub(/\(.*/, "", name); np = 0; nc = 0; ld = 0; st = 0; inparams = 1 }
      next
    }
    inparams && /\.param/ { np++ }
    inparams && /^\)/ { inparams = 0 }
    name != "" {
      if ($0 ~ /ld\.global\.nc/) nc++
      else if ($0 ~ /ld\.global/) ld++
      if ($0 ~ /st\.global/) st++
    }
    END { flush() }' "$p"
done
