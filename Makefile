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
	$(BIN)/python -m pip install -q -e '.[test,import,dist]'
	@touch $@ $(VENV)/.installed

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py swapdsl/planning/_fastplan.c
	$(BIN)/python -m pip install -q -e .
	@touch $@

# the demo's real data set comes with scikit-learn (the `examples` extra)
$(VENV)/.installed-examples: $(BIN)/python pyproject.toml setup.py swapdsl/planning/_fastplan.c
	$(BIN)/python -m pip install -q -e '.[examples]'
	@touch $@ $(VENV)/.installed


# What the demo writes (plans, figures, the digits data, checkpoint, log), where you can find it.
OUT := demo-output

# one BLAS thread: the demo's matrices are small, and on cores other work shares more threads made it 4x slower
demo: export OPENBLAS_NUM_THREADS = 1
demo: $(VENV)/.installed-examples
	@mkdir -p $(OUT)
	@for m in mlp tiny_transformer tiny_resnet; do $(BIN)/swapdsl check stdlib/models/$$m.swp || exit $$?; done
	$(BIN)/swapdsl check $(DEMO_MODEL) --training -D batch=256 -D width=64
	$(BIN)/swapdsl exec $(DEMO_MODEL) --steps 10
	$(BIN)/python bench/zoo.py
	$(BIN)/swapdsl devices
	$(BIN)/swapdsl optimize stdlib/models/resnet.swp --memory 8GiB --method belady -o $(OUT)/resnet.plan
	$(BIN)/swapdsl simulate $(OUT)/resnet.plan
	$(BIN)/swapdsl show $(OUT)/resnet.plan --plot $(OUT)/resnet.png
	@echo "== the second lever: recompute cheap activations where the bus cannot keep up"
	$(BIN)/swapdsl optimize stdlib/models/resnet.swp --memory 8GiB --method capuchin -o $(OUT)/resnet-capuchin.plan
	$(BIN)/swapdsl optimize stdlib/models/tiny_resnet.swp -D batch=8 --memory 3MiB --method ga --budget 10 -o $(OUT)/tiny.plan
	$(BIN)/swapdsl exec $(OUT)/tiny.plan --steps 5 --check
	@echo "== real data: scikit-learn's handwritten digits, trained under 1/3 of the memory the step needs unswapped"
	$(BIN)/python examples/digits.py $(OUT)/digits
	$(BIN)/swapdsl optimize examples/digits.swp --memory 1/3 --method ga --budget 5 -o $(OUT)/digits.plan
	@rm -f $(OUT)/digits.jsonl
	$(BIN)/swapdsl exec $(OUT)/digits.plan --data $(OUT)/digits/train --shuffle --epochs 60 --eval $(OUT)/digits/test \
		--eval-every 330 --save $(OUT)/digits.safetensors --log $(OUT)/digits.jsonl
	$(BIN)/swapdsl plot-log $(OUT)/digits.jsonl -o $(OUT)/digits.png
	$(BIN)/swapdsl predict $(OUT)/digits.plan --data $(OUT)/digits/test --init $(OUT)/digits.safetensors -o $(OUT)/digits.npz
	@echo "== the demo's files are in $(CURDIR)/$(OUT)/:"
	@echo "   resnet.plan resnet.png resnet-capuchin.plan tiny.plan digits/ (train/, test/) digits.plan digits.safetensors digits.jsonl digits.png digits.npz"

# -n auto: pytest-xdist, one worker per core. SWAPDSL_HYPOTHESIS=ci|long: more memory-safety cases.
# One BLAS thread per test worker: the workers already fill the cores, and OpenBLAS's spinning threads on
# shared cores made NumPy steps 2-4x slower (test_runtime + test_training: 58 s -> 36 s on 2 cores).
test: $(VENV)/.installed-test
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist worksteal

bench: $(VENV)/.installed
	$(BIN)/python bench/parse_scaling.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis $(OUT)
