# The two set-up commands: `make serve` (the main job) and `make test` (the whole suite).
# Both create or reuse one virtual environment in a cache outside the clone, keyed by requirements/base.txt.
SHELL := /bin/bash
# The cache root has one definition, sglang_prorsa/srt/common/paths.py ($SGLANG_PRORSA_CACHE, else
# ~/.cache/sglang-prorsa): asked here (standard library only, no venv needed), and exported, so that what make runs
# (the tiny model, the libcuda stub, kernel builds, the file KV store) uses the same root as the venv, also with
# `make CACHE=...`.
ifndef CACHE
CACHE := $(shell python3 -I sglang_prorsa/srt/common/paths.py)
endif
ifeq ($(strip $(CACHE)),)
$(error cannot read the cache root from sglang_prorsa/srt/common/paths.py (is python3 installed?); pass CACHE=DIR)
endif
export SGLANG_PRORSA_CACHE := $(CACHE)
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

.PHONY: env serve serve-single test test-unit test-integration test-full lint which-python bench demo

env:
	@bash scripts/bootstrap.sh "$(VENV)" "$(REQ)"

which-python:
	@echo $(PY)

# The adaptive server on the embedded default model (CPU recipe applied automatically without a GPU).
serve: env
	$(PY) -m sglang_prorsa.launch_server --pd-adaptive --host $(HOST) --port $(PORT) $(SERVE_ARGS)

# See it switch (about two minutes), against `make serve` running in another terminal: agentic episodes whose
# prefill:decode mix shifts; prints the forecast, each control decision and each busy switch; writes demo-out/.
demo: env
	$(PY) examples/demo_switch.py --url http://$(HOST):$(PORT)

# One plain SGLang server (with the Prorsa routes) on the embedded default model.
serve-single: env
	$(PY) -m sglang_prorsa.launch_server --host $(HOST) --port $(PORT) $(SERVE_ARGS)

test: env
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-unit: env
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: env
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

# Every property test at its full example count (the suite runs the `ci` profile: about a tenth).
test-full: env
	$(PY) -m pytest tests --hypothesis-profile=full $(PYTEST_ARGS)

# ruff on the whole repository, mypy on the pure policy package (mypy.ini); CI runs it before `make test`.
lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
