# The two commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEMO_MODEL ?= stdlib/models/tiny_resnet.swp

.PHONY: demo test bench clean

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "error: no python3.11 or python3 on PATH; run 'make PYTHON=/path/to/python3 ...'"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Editable installs, so the tree you edit is the tree you run.
$(VENV)/.installed-test: $(BIN)/python pyproject.toml setup.py swapdsl/planning/_fastplan.c
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@ $(VENV)/.installed

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py swapdsl/planning/_fastplan.c
	$(BIN)/python -m pip install -q -e .
	@touch $@

demo: $(VENV)/.installed
	@for m in mlp tiny_transformer tiny_resnet; do $(BIN)/swapdsl check stdlib/models/$$m.swp || exit $$?; done
	$(BIN)/swapdsl check $(DEMO_MODEL) --training -D batch=256 -D width=64
	$(BIN)/swapdsl exec $(DEMO_MODEL) --steps 10
	$(BIN)/python bench/zoo.py
	$(BIN)/swapdsl devices
	$(BIN)/swapdsl optimize stdlib/models/resnet.swp --memory 8GiB --method belady -o .venv/resnet.plan
	$(BIN)/swapdsl simulate .venv/resnet.plan
	$(BIN)/swapdsl show .venv/resnet.plan
	$(BIN)/swapdsl optimize stdlib/models/tiny_resnet.swp -D batch=8 --memory 3MiB --method ga --budget 10 -o .venv/tiny.plan
	$(BIN)/swapdsl exec .venv/tiny.plan --steps 5 --check

# -n auto: pytest-xdist, one worker per core. SWAPDSL_HYPOTHESIS=ci|long: more memory-safety cases.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n auto

bench: $(VENV)/.installed
	$(BIN)/python bench/parse_scaling.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
