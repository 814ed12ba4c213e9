# One Makefile for people and CI. `make test` builds its own environment from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime

.PHONY: test lint typecheck pytest bench bench-compare demo clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo needs only what wfsub itself needs: no test or lint tools.
$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

test: $(STAMP)
	$(BIN)/ruff check wfsub tests examples bench
	$(BIN)/mypy wfsub
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

# Same-run comparison with another commit: make bench-compare REF=HEAD~1
REF ?= HEAD~1
bench-compare: $(STAMP)
	$(BIN)/python -m bench.compare $(REF)

demo: $(RUNTIME_STAMP)
	$(BIN)/python examples/order_flow.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo
