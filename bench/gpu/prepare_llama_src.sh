#!/usr/bin/env bash
# Runs HERE (the dev machine): unpack llama.cpp from the llama-cpp-python
# 0.3.36 sdist and prune it to what bench/gpu/run.sh builds (libllama, ggml
# CPU + CUDA backends, llama-bench, llama-completion), ~20 MB, so it fits the
# device tool's 64 MiB carry limit. Output: <repo>/.llama-cuda-src (in
# .gitignore). Never commit it.
#
#   bench/gpu/prepare_llama_src.sh [path/to/llama_cpp_python-0.3.36.tar.gz]
#
# Get the sdist with:
#   pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SDIST="${1:-$HOME/.cache/redlite/llama_cpp_python-0.3.36.tar.gz}"
DEST="$ROOT/.llama-cuda-src"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

tar -xzf "$SDIST" -C "$TMP"
SRC="$(echo "$TMP"/llama_cpp_python-*/vendor/llama.cpp)"
rm -rf "$DEST"
mkdir -p "$DEST"
for p in CMakeLists.txt LICENSE cmake common include src ggml vendor tools licenses; do
  cp -a "$SRC/$p" "$DEST/"
done
for d in "$DEST"/ggml/src/ggml-*/; do
  case "$(basename "$d")" in ggml-cpu|ggml-cuda) ;; *) rm -rf "$d";; esac
done
for d in "$DEST"/tools/*/; do
  case "$(basename "$d")" in llama-bench|completion) ;; *) rm -rf "$d";; esac
done
cat > "$DEST/tools/CMakeLists.txt" <<'CM'
# pruned by redlite bench/gpu/prepare_llama_src.sh
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(completion)
CM
{
  echo "sdist: $(basename "$SDIST")"
  echo "sha256: $(sha256sum "$SDIST" | cut -d' ' -f1)"
} > "$DEST/PROVENANCE.txt"
# The redlite binary travels next to it, stripped and gzipped (the carry
# limit is 64 MiB; bench/gpu/common.sh unpacks it). Build it first:
# cargo build --release -p redlite-cli --features cuda.
mkdir -p "$ROOT/.bench-bin"
if [[ -x "$ROOT/target/release/redlite" ]]; then
  rm -f "$ROOT/.bench-bin/redlite"
  strip -o "$TMP/redlite" "$ROOT/target/release/redlite"
  gzip -c "$TMP/redlite" > "$ROOT/.bench-bin/redlite.gz"
fi
du -sh "$DEST" "$ROOT/.bench-bin"
