# Sourced by the bench/gpu scripts, ON THE GPU MACHINE: the repo root as
# the working directory, $OUT for logs, the CUDA libraries on the loader
# path, $WORK (/dev/shm) for synth files and builds, and $R, the redlite
# binary (.bench-bin/redlite, unpacked from .bench-bin/redlite.gz if that
# is what was carried; else target/release/redlite).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/bench/gpu/out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WORK=/dev/shm/redlite-bench
mkdir -p "$WORK"
# Every carried binary (e.g. a baseline build beside the one under test,
# for REDLITE=... in cuda.sh's envab step).
for z in .bench-bin/*.gz; do
  [[ -f $z && ! -x ${z%.gz} ]] && gunzip -kf "$z" && chmod +x "${z%.gz}"
done
R="${REDLITE:-$ROOT/.bench-bin/redlite}"
[[ -x $R ]] || R="$ROOT/target/release/redlite"
[[ -x $R ]] || { echo "no redlite binary (carry .bench-bin)"; exit 2; }
# synth_file LAYOUT -> path of the synth file (seed 0) in $WORK, written
# the first time it is asked for.
synth_file() {
  local m="$WORK/synth-$1-s0.gguf"
  [[ -f $m ]] || timeout 300 "$R" synth --layout "$1" --seed 0 --out "$m" --threads "$(nproc)" --quiet >&2
  echo "$m"
}
