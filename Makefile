# Fresh machine: `make experiment` (main job) or `make test` (test suite).
# torch is pinned to the 2.13.0 CPU wheel *before* the package is installed, so pip never
# resolves torch>=2.2 to a multi-GB CUDA build.
PYTHON ?= python3
JOBS ?= 2
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test experiment experiment-full bench clean

$(STAMP): pyproject.toml requirements-setup.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-setup.txt
	$(BIN)/python -m pip install -q -e ".[moabb,flower,bench,dev]"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q -ra

experiment: setup
	$(BIN)/python -m benchmarks.tableone --jobs $(JOBS)

experiment-full: setup
	$(BIN)/python -m benchmarks.tableone --full --jobs $(JOBS)

bench: setup
	$(BIN)/python benchmarks/bench_spdnet_step.py

clean:
	rm -rf $(VENV) results .pytest_cache
