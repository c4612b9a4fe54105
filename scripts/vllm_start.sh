#!/bin/sh
# Start the local vLLM server (`make vllm` installs it) on 127.0.0.1, print its base URL once
# /health answers, and keep serving until Ctrl-C, SIGTERM or SIGHUP, which stop vLLM's whole
# process group (engine/remote/server.py serve_until_stopped). `exec`: the signals go to the
# starter itself, not to a shell that would die and leave it running. Arguments go to
# `python -m engine.remote.server start` (--port N, --compile, --speculate).
set -eu
cd "$(dirname "$0")/.."
APP_PYTHON="${APP_PYTHON:-.venv/bin/python}"
HF_HUB_OFFLINE=1 exec "$APP_PYTHON" -m engine.remote.server start "$@"
