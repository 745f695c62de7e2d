# Fresh machine: `make experiment` (main job) or `make test` (test suite).
# torch is pinned to the 2.13.0 CPU wheel *before* the package is installed, so pip never
# resolves torch>=2.2 to a multi-GB CUDA build.
PYTHON ?= python3
JOBS ?= 2
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
# Warnings are errors; --keep-going reports all of them before failing.
SPHINXOPTS ?= -W --keep-going
SPHINXBUILD = $(BIN)/python -m sphinx -b html $(SPHINXOPTS)

.PHONY: setup test experiment experiment-full bench docs docs-noexec docs-setup package-check clean

$(STAMP): pyproject.toml requirements-setup.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-setup.txt
	$(BIN)/python -m pip install -q -e ".[moabb,flower,privacy,bench,dev]"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q -ra

experiment: setup
	$(BIN)/python -m benchmarks.experiments table-one --jobs $(JOBS)

experiment-full: setup
	$(BIN)/python -m benchmarks.experiments table-one --full --jobs $(JOBS)

# The documentation site, docs/_build/html: `make docs` executes the gallery examples
# (examples/; those on the offline EEG only where the data are), `make docs-noexec` does not.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs-setup: $(DOCS_STAMP)

docs: docs-setup
	FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 $(SPHINXBUILD) docs docs/_build/html

docs-noexec: docs-setup
	$(SPHINXBUILD) -D plot_gallery=0 docs docs/_build/html

# Wheel and sdist, the wheel installed with its moabb extra into a fresh venv and imported.
package-check:
	bash .ci/package-check

bench: setup
	$(BIN)/python benchmarks/bench_spdnet_step.py

clean:
	rm -rf $(VENV) results .pytest_cache docs/_build docs/generated docs/auto_examples docs/sg_execution_times.rst dist
