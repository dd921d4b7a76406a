# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test lint docs install install-dev bench bench-cli clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Core install (torch, timm, open_clip, faiss, ...). The stamp re-runs pip when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/oodbench demo --out oodbench-demo

test: install-dev
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# ruff (style and formatting) and import-linter (the package layers of docs/architecture.md).
lint: install-dev
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(BIN)/lint-imports

# The docs site; --strict fails on a broken link, a missing page or an API reference to a moved function.
# tools/check_docs.py fails first on unfinished text (TODO, "To be completed") or the project's issue
# numbers, and then on a built page whose links would not work from disk (file://).
docs: install-dev
	$(BIN)/python tools/check_docs.py docs README.md
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d site
	$(BIN)/python tools/check_docs.py --site site

bench-cli: install
	$(BIN)/python benchmarks/cli_startup.py

bench: install-dev
	$(BIN)/python benchmarks/detectors.py

clean:
	rm -rf $(VENV) oodbench-demo .pytest_cache site
