#!/usr/bin/env bash
# CI gate for the CUDA kernels (no GPU, no toolkit needed): compile every
# crates/cuda/kernels/*.cu exactly as the engine does at run time (NVRTC,
# sm_90, headers inlined) and assemble the PTX with ptxas -arch=sm_90,
# printing registers and spills; checks every kernel argument struct's
# layout against NVRTC's (src/arg_layouts.rs); then `cargo check -p
# redlite-cuda`. scripts/ptx-loads.sh prints the per-kernel load census.
#
# Tools come from PyPI into the repo's .venv, pinned. The nvcc wheel
# (nvidia-cuda-nvcc-cu12) carries ptxas but no nvcc driver, so NVRTC
# (nvidia-cuda-nvrtc-cu12) does the C++ -> PTX step; that is also the
# path the engine takes on the GPU machine (its own NVRTC, CUDA 13.0).
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_PIN="nvidia-cuda-nvrtc-cu12==12.9.86"
NVCC_PIN="nvidia-cuda-nvcc-cu12==12.9.86"

[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -m pip show nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12 >/dev/null 2>&1; then
  echo "==> installing $NVRTC_PIN $NVCC_PIN into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$NVRTC_PIN" "$NVCC_PIN" || {
    echo "ERROR: could not install the CUDA compiler wheels from PyPI ($NVRTC_PIN, $NVCC_PIN)" >&2
    exit 1
  }
fi
site="$(.venv/bin/python -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')"
nvrtc_lib="$site/nvidia/cuda_nvrtc/lib"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
[ -e "$nvrtc_lib/libnvrtc.so.12" ] || { echo "ERROR: libnvrtc.so.12 missing under $nvrtc_lib" >&2; exit 1; }
[ -x "$ptxas" ] || { echo "ERROR: ptxas missing at $ptxas" >&2; exit 1; }

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "==> NVRTC: crates/cuda/kernels/*.cu -> PTX (sm_90)"
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo run --quiet --locked -p redlite-cuda --example compile_kernels -- "$out"
n_cu=$(ls crates/cuda/kernels/*.cu | wc -l)
n_ptx=$(ls "$out"/*.ptx | wc -l)
[ "$n_cu" = "$n_ptx" ] || { echo "ERROR: $n_cu .cu files but $n_ptx PTX files" >&2; exit 1; }
echo "==> PDL: one griddepcontrol.wait per kernel entry"
for p in "$out"/*.ptx; do
  # --pdl is only correct if every kernel waits for its predecessor
  # (PDL_PROLOGUE in common.cuh); count in the PTX, after macro expansion.
  n_entry=$(grep -c '\.entry ' "$p" || true)
  n_wait=$(grep -c 'griddepcontrol\.wait' "$p" || true)
  [ "$n_entry" = "$n_wait" ] || {
    echo "ERROR: $(basename "$p"): $n_entry kernels but $n_wait griddepcontrol.wait" >&2
    exit 1
  }
done
echo "==> every kernel entry is in src/kernels.rs's list (the engine loads only those)"
for p in "$out"/*.ptx; do
  for k in $(sed -n 's/^\.visible \.entry \([A-Za-z0-9_]*\)(.*/\1/p' "$p"); do
    grep -qxF "$k" "${p%.ptx}.kernels" || {
      echo "ERROR: $(basename "$p" .ptx).cu defines kernel $k, which src/kernels.rs does not list" >&2
      exit 1
    }
  done
done
echo "==> ptxas -arch=sm_90"
for p in "$out"/*.ptx; do
  "$ptxas" -arch=sm_90 -v "$p" -o "${p%.ptx}.cubin" 2>&1 |
    awk -v f="$(basename "$p" .ptx)" '/Compiling entry/ {k=$7} /spill/ {s=$5} /registers/ {print f": "k" "$5" registers, "s" bytes spilled"}'
done
echo "==> kernel argument structs: Rust layout vs NVRTC's (probe kernels)"
# The test skips itself where no libnvrtc loads; here one must, so a skip
# is a failure.
probe_log="$out/arg_layouts.log"
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --quiet --locked -p redlite-cuda --lib arg_layouts -- --nocapture >"$probe_log" 2>&1 || {
  cat "$probe_log" >&2
  echo "ERROR: kernel argument struct layouts differ (see above)" >&2
  exit 1
}
if grep -q "no libnvrtc, skipped" "$probe_log"; then
  echo "ERROR: the layout probe found no libnvrtc under $nvrtc_lib" >&2
  exit 1
fi
echo "==> cargo check -p redlite-cuda"
cargo check --quiet --locked -p redlite-cuda --all-targets
echo "CUDA kernels OK"
