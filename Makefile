# rl_gap: `make demo` trains gSAP, mSAP and InfoNCE on many-class glyphs (paired seeds); `make test` runs the CPU test suite.
# Both bootstrap .venv on a fresh machine: exact versions from constraints.txt (setup.cfg
# states lower bounds for torch and numpy, so `pip install .` into an existing environment keeps its torch).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rl_gap-installed
export WANDB_MODE ?= offline
export WANDB_SILENT ?= true
export PYTHONHASHSEED ?= 0

.PHONY: venv test test-all demo lint bench clean gpu-check gpu-wheels

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==26.3
	# torch first, on its own: pip takes these two from the local wheel cache.
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,tune]'
	# `rl-gap fit --help` without importing torch (rl_gap/help_spec/); live if this fails.
	$(PY) -m rl_gap.help_spec || echo "help spec not recorded: training --help stays live"
	touch $(STAMP)

venv: $(STAMP)

# RL_GAP_NATIVE=1: a C++ helper that fails to build is an error, not a silent skip of the
# native-vs-torch tests.
test: $(STAMP)
	RL_GAP_NATIVE=1 $(PY) -m pytest -m "not slow" -p no:cacheprovider tests

test-all: $(STAMP)
	RL_GAP_NATIVE=1 $(PY) -m pytest -p no:cacheprovider tests

demo: $(STAMP)
	$(PY) -m rl_gap.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check rl_gap tests research benchmarks tools
	$(VENV)/bin/ruff format --check rl_gap tests research benchmarks tools

# GPU check (docs/gpu.md): `make gpu-wheels` here fills .wheels/ with what a bare GPU machine
# lacks; `make gpu-check` there proves a GPU run in under 8 minutes (DEVICE=cpu rehearses it).
# No venv bootstrap: the machine's own Python and torch (the local .venv where there is one).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
DEVICE ?= cuda
GPU_CHECK_OUT ?= runs/gpu-check

gpu-wheels:
	$(GPU_PYTHON) tools/gpu_wheels.py download

gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --device $(DEVICE) --out $(GPU_CHECK_OUT)

clean:
	rm -rf runs .pytest_cache .ruff_cache
