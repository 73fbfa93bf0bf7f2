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

# the demo's real data set comes with scikit-learn (the `examples` extra)
$(VENV)/.installed-examples: $(BIN)/python pyproject.toml setup.py swapdsl/planning/_fastplan.c
	$(BIN)/python -m pip install -q -e '.[examples]'
	@touch $@ $(VENV)/.installed

# mlp on 8x8 digits, deep enough that 1/3 of its no-swap memory (799 KiB) is above its smallest cap (241 KiB)
DIGITS := -D features=64 -D hidden=128 -D depth=4 -D lr=0.002

demo: $(VENV)/.installed-examples
	@for m in mlp tiny_transformer tiny_resnet; do $(BIN)/swapdsl check stdlib/models/$$m.swp || exit $$?; done
	$(BIN)/swapdsl check $(DEMO_MODEL) --training -D batch=256 -D width=64
	$(BIN)/swapdsl exec $(DEMO_MODEL) --steps 10
	$(BIN)/python bench/zoo.py
	$(BIN)/swapdsl devices
	$(BIN)/swapdsl optimize stdlib/models/resnet.swp --memory 8GiB --method belady -o .venv/resnet.plan
	$(BIN)/swapdsl simulate .venv/resnet.plan
	$(BIN)/swapdsl show .venv/resnet.plan
	@echo "== the second lever: recompute cheap activations where the bus cannot keep up"
	$(BIN)/swapdsl optimize stdlib/models/resnet.swp --memory 8GiB --method capuchin -o .venv/resnet-capuchin.plan
	$(BIN)/swapdsl optimize stdlib/models/tiny_resnet.swp -D batch=8 --memory 3MiB --method ga --budget 10 -o .venv/tiny.plan
	$(BIN)/swapdsl exec .venv/tiny.plan --steps 5 --check
	@echo "== real data: scikit-learn's handwritten digits, trained under 1/3 of the memory the step needs unswapped"
	$(BIN)/python examples/digits.py .venv/digits
	$(BIN)/swapdsl optimize stdlib/models/mlp.swp $(DIGITS) --memory 266KiB --method ga --budget 5 -o .venv/digits.plan
	@rm -f .venv/digits.jsonl
	$(BIN)/swapdsl exec .venv/digits.plan --data .venv/digits/train --shuffle --epochs 60 --eval .venv/digits/test \
		--eval-every 330 --save .venv/digits.safetensors --log .venv/digits.jsonl
	$(BIN)/swapdsl plot-log .venv/digits.jsonl -o .venv/digits.png

# -n auto: pytest-xdist, one worker per core. SWAPDSL_HYPOTHESIS=ci|long: more memory-safety cases.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n auto

bench: $(VENV)/.installed
	$(BIN)/python bench/parse_scaling.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
