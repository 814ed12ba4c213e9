# One Makefile for people and CI. `make test` builds its own environment from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime
PEERS_STAMP := $(VENV)/.installed-peers
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: test lint typecheck pytest bench bench-compare bench-peers demo docs clean chaos chaos-ci flake

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

# Peer engines for `make bench-peers` only: `make test` and `make bench` never need them. A failed install does
# not stop the bench, which reports a missing peer as "not run"; the stamp is written only on success, so the
# next run tries again.
$(PEERS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,peers]' && touch $(PEERS_STAMP) \
		|| echo "bench-peers: the peers extra did not install; the missing peers are reported as not run"

# The documentation site's tools (MkDocs, Material, mkdocstrings) only: `make docs` needs neither the test nor the
# lint tools.
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check wfsub tests examples bench

typecheck: $(STAMP)
	$(BIN)/mypy wfsub

# The suite on two worker processes (pytest-xdist; `make pytest PYTEST_ARGS=-x` runs it in one). --dist worksteal:
# a worker that runs out of tests takes queued ones from the other, so the few long tests (100,000 evicted cases,
# the differential fuzz, kill -9 runs, the command's subprocesses) do not leave one worker idle while the other
# works through a whole file, as --dist loadfile does. Any status but 0 fails the target, 5 ("no tests
# collected") included: a suite that collects nothing fails CI.
PYTEST_ARGS ?= -n 2 --dist worksteal --durations=20
pytest: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

# Same-run comparison with another commit: make bench-compare REF=HEAD~1
REF ?= HEAD~1
bench-compare: $(STAMP)
	$(BIN)/python -m bench.compare $(REF)

# wfsub beside DBOS (durable, SQLite) and SpiffWorkflow (sequence, multi-instance), same machine, same run.
bench-peers: $(PEERS_STAMP)
	$(BIN)/python -m bench peers

demo: $(RUNTIME_STAMP)
	$(BIN)/python examples/order_flow.py

# The documentation (mkdocs.yml, docs/) into site/, warnings as errors: a broken link, a missing anchor or a
# docstring mkdocstrings cannot read fails the build. NO_MKDOCS_2_WARNING quiets Material's banner about its future.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo site

# The chaos campaign (tests/chaos): seeded faults against Postgres nodes and a SQLite owner, then a checker of what
# the stores hold. `make chaos SEED=7 MINUTES=5`; without SEED a seed is drawn (and printed). It needs the
# Postgres server binaries (initdb, pg_ctl): it runs a private server of its own.
SEED ?=
MINUTES ?= 1
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos $(if $(SEED),--seed $(SEED)) --minutes $(MINUTES)

# CI's one-minute run: the seed follows the commit, so a red run is reproduced with the seed it prints.
chaos-ci: $(STAMP)
	$(BIN)/python -m tests.chaos --seed $$(( 0x$$(git rev-parse --short=7 HEAD 2>/dev/null || echo 1) % 1000000 )) --minutes 1

# The whole suite N times, each in an order drawn from a printed seed, every second run beside two busy
# processes; then each test that failed at least once, with its count (tests/flake.py).
N ?= 20
flake: $(STAMP)
	$(BIN)/python -m tests.flake --runs $(N)
