# The two commands of the README: `make demo` runs the main job, `make test` the tests.
# Each creates .venv and installs what it needs from nothing (the demo: the package; the tests: every extra).
# `make test` also type-checks (mypy) and builds the documentation site (mkdocs, into build/site) strictly.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
DEV := $(VENV)/.installed

.PHONY: demo test test-slow lint docs bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "skynet-dspy needs Python 3.11 or newer: run PYTHON=python3.11 make ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(BASE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(BASE)

$(DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(DEV) $(BASE)

demo: $(BASE)
	$(BIN)/python -m examples.demo

test: $(DEV)
	$(BIN)/ruff check skynet_dspy tests examples benchmarks mkdocs_hooks.py
	$(BIN)/lint-imports
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site
	$(BIN)/python -m pytest -q -n auto --dist loadgroup -m "not slow"

# The tests marked slow (whole optimizations, notebooks, soaks, Ray clusters): CI runs them after `make test`.
# Those marked alone (measured time, thread counts) run one at a time after the others.
test-slow: $(DEV)
	$(BIN)/python -m pytest -q -n auto --dist loadgroup -m "slow and not alone"
	$(BIN)/python -m pytest -q -p no:xdist -m "slow and alone"

lint: $(DEV)
	$(BIN)/ruff check skynet_dspy tests examples benchmarks mkdocs_hooks.py
	$(BIN)/lint-imports
	$(BIN)/mypy

docs: $(DEV)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

bench: $(DEV)
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info
