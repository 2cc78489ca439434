# The two commands of the README: `make demo` runs the main job, `make test` the tests.
# Each creates .venv and installs from nothing when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

test: $(STAMP)
	$(BIN)/ruff check skynet_dspy tests examples benchmarks
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n auto

lint: $(STAMP)
	$(BIN)/ruff check skynet_dspy tests examples benchmarks
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
