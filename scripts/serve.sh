#!/bin/sh
# The one way the app is served: `make run` here and the Docker image's CMD on a Hugging Face
# Space both run this script, so what the tests start is what a Space runs.
#   PORT                        listening port (default 8501; the image sets 7860)
#   ADDRESS                     listening address (default 0.0.0.0, as a container needs)
#   PYTHON                      the interpreter (default: .venv/bin/python if present, else python)
#   INFERENCE_EXPLORER_HOSTED   1 = hosted demo: shared model (float32 and q4_0), hosted limits (read by app.py)
#   INFERENCE_EXPLORER_CLICK_S  hosted model time per click in seconds (default 15)
set -eu
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
exec "$PYTHON" scripts/streamlit_app.py \
  --server.port "${PORT:-8501}" --server.address "${ADDRESS:-0.0.0.0}" --server.headless true
