#!/bin/sh
# Convert the default model once into the per-user cache ($HOME/.cache/inference-explorer), as the
# Docker image does at build time and `make model` does here; later loads read the cache.
set -eu
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" exec "$PYTHON" -c \
  "from engine import load_model; m = load_model(progress=print); print(m.spec.name, f'{m.load_seconds:.1f} s')"
