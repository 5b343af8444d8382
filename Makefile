# rl_gap: `make demo` trains the MNIST demo with three losses; `make test` runs the CPU test suite.
# Both bootstrap .venv (pinned installs) on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rl_gap-installed
export WANDB_MODE ?= offline
export WANDB_SILENT ?= true
export PYTHONHASHSEED ?= 0

.PHONY: venv test test-all demo lint bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==26.3
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -p no:cacheprovider tests

test-all: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests

demo: $(STAMP)
	$(PY) -m rl_gap.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check rl_gap tests scripts
	$(VENV)/bin/ruff format --check rl_gap tests scripts

clean:
	rm -rf runs .pytest_cache .ruff_cache
