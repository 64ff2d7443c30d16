# Two commands on a fresh clone: `make bench` and `make test`.
# Both bootstrap .venv with the exact CPU build of torch that results are
# measured against (TORCH_VERSION is also pinned in asv.conf.json).
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvbench-installed

.PHONY: bench test test-virtualenv report venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -qq -e ".[dev]"
	touch $(STAMP)

bench: $(STAMP)
	$(BIN)/kvbench run

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-virtualenv: $(STAMP)
	$(BIN)/python -m pytest -q -m virtualenv --run-virtualenv

clean:
	rm -rf $(VENV) .asv build *.egg-info
