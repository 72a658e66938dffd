# The two set-up commands: `make serve` (the main job) and `make test` (the whole suite).
# Both create or reuse one virtual environment in a cache outside the clone, keyed by requirements/base.txt.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/sglang-prorsa
REQ := requirements/base.txt
REQ_KEY := $(shell sha256sum $(REQ) | cut -c1-12)
VENV := $(CACHE)/venv-$(REQ_KEY)
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 30000
SERVE_ARGS ?=
PYTEST_ARGS ?=
# `python -m` would put the checkout first on sys.path, where ./kernels shadows PyPI's `kernels` (a dependency of
# sglang and transformers); the package is installed (editable), so the checkout itself need not be on the path.
export PYTHONSAFEPATH := 1

.PHONY: env serve serve-single test test-unit test-integration which-python bench

env:
	@bash scripts/bootstrap.sh "$(VENV)" "$(REQ)"

which-python:
	@echo $(PY)

# The adaptive server on the embedded default model (CPU recipe applied automatically without a GPU).
serve: env
	$(PY) -m sglang_prorsa.launch_server --pd-adaptive --host $(HOST) --port $(PORT) $(SERVE_ARGS)

# One plain SGLang server (with the Prorsa routes) on the embedded default model.
serve-single: env
	$(PY) -m sglang_prorsa.launch_server --host $(HOST) --port $(PORT) $(SERVE_ARGS)

test: env
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-unit: env
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: env
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)
