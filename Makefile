# fairseq-rope: `make demo` and `make test` set everything up themselves.
#
# torch is installed first and pinned (TORCH_VERSION, the CPU wheel here) unless
# the venv already has one: a bare torch requirement would pull multi-GB CUDA
# builds. fairseq compiles C++ extensions against that torch, hence
# --no-build-isolation once torch, numpy and cython are in.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.fairseq-rope-installed
DEMO_DIR ?= demo

.PHONY: setup demo test test-slow test-all clean-demo

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null \
		&& echo "torch already installed: $$($(BIN)/python -c 'import torch; print(torch.__version__)')" \
		|| $(BIN)/python -m pip install "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -q numpy cython setuptools wheel
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[test]"
	@touch $@

demo: setup
	PYTHON="$(abspath $(BIN))/python" scripts/demo.sh $(DEMO_DIR)

test: setup
	$(BIN)/python -m pytest

test-slow: setup
	$(BIN)/python -m pytest -m slow

test-all: setup
	$(BIN)/python -m pytest -m ""

clean-demo:
	rm -rf $(DEMO_DIR)
