# The two commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEMO_MODEL ?= stdlib/models/tiny_resnet.swp

.PHONY: demo test bench clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; run 'make PYTHON=python3 ...'"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Editable install, so the tree you edit is the tree you run.
$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	@touch $@

demo: $(VENV)/.installed
	$(BIN)/swapdsl check $(DEMO_MODEL)
	$(BIN)/swapdsl check $(DEMO_MODEL) -D batch=256 -D width=32 --json

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed
	$(BIN)/python bench/parse_scaling.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
