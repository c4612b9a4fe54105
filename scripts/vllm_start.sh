#!/bin/sh
# Start the local vLLM server (`make vllm` installs it) on 127.0.0.1, print its base URL once
# /health answers, and keep serving until interrupted. Arguments go to
# `python -m engine.remote.server start` (--port N, --compile, --speculate).
set -eu
cd "$(dirname "$0")/.."
APP_PYTHON="${APP_PYTHON:-.venv/bin/python}"
HF_HUB_OFFLINE=1 exec "$APP_PYTHON" -m engine.remote.server start "$@"
