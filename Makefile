# fairseq-rope: `make demo` and `make test` set everything up themselves.
#
# torch is installed first and pinned (TORCH_VERSION, the CPU wheel here) unless
# the venv already has one: a bare torch requirement would pull multi-GB CUDA
# builds. fairseq compiles C++ extensions against that torch, hence
# --no-build-isolation once torch, numpy and cython are in.
#
# The runtime (runtime/, fairseq-rope-serve: translate and serve without torch) is installed
# first: fairseq-rope depends on it and it is not on the package index. Its dependencies are
# also kept as wheels in RUNTIME_WHEELS, from which tests/serve/test_alone.py installs it into
# a fresh venv without torch, offline.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.fairseq-rope-installed
RUNTIME_WHEELS := $(VENV)/runtime-wheels
TRITON_STAMP := $(VENV)/.fairseq-rope-triton-installed
DEMO_DIR ?= demo

.PHONY: setup demo test test-slow test-all test-gpu test-triton test-browser clean-demo wheelhouse

setup: $(STAMP)

$(STAMP): pyproject.toml runtime/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null \
		&& echo "torch already installed: $$($(BIN)/python -c 'import torch; print(torch.__version__)')" \
		|| $(BIN)/python -m pip install "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -q numpy cython setuptools wheel
	$(BIN)/python -m pip install -q --no-build-isolation -e runtime
	@# fairseq's six C/C++ extensions, built side by side (scripts/parallel_build.sh).
	source scripts/parallel_build.sh && with_parallel_build $(BIN)/python -m pip install -q --no-build-isolation -e ".[test]"
	@# A venv that had fairseq-rope before 2026-11-27 lost fairseq-rope-translate when the old
	@# fairseq-rope (which installed it then) was replaced: the runtime installs it again.
	@test -x $(BIN)/fairseq-rope-translate \
		|| $(BIN)/python -m pip install -q --no-build-isolation --no-deps --force-reinstall -e runtime
	$(BIN)/python -m pip wheel -q --no-build-isolation --wheel-dir $(RUNTIME_WHEELS) ./runtime
	rm -f $(RUNTIME_WHEELS)/fairseq_rope_serve-*.whl
	@touch $@

demo: setup
	PYTHON="$(abspath $(BIN))/python" scripts/demo.sh $(DEMO_DIR)

# One pytest-xdist worker per core; a test file stays on one worker, so its module fixtures
# (a 2-process training, a trained model) are built once.
TEST_WORKERS ?= auto
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(BIN)/python -m pytest $(PARALLEL)

test-slow: setup
	$(BIN)/python -m pytest $(PARALLEL) -m slow

# Everything CPU can run (the GPU tests need FAIRSEQ_ROPE_GPU_TESTS_DEVICE=cpu here: test-gpu).
test-all: $(TRITON_STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m "not gpu"

test-gpu: setup
	$(BIN)/python -m pytest -m gpu tests/gpu

# The fused Triton rotation under Triton's interpreter on the CPU (tests/triton, docs/gpus.md).
# Triton is a 290 MB download (1 GB installed) that `make test` does without: its own target,
# which .ci/run runs after `make test`.
$(TRITON_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[test,triton]"
	@touch $@

test-triton: $(TRITON_STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m triton tests/triton

# The server's page in a real browser: Debian's chromium, headless (apt; nothing that downloads
# a browser of its own). .ci/run runs it.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CHROMIUM := $(SUDO) apt-get install -y -q --no-install-recommends chromium
test-browser: setup
	@command -v chromium >/dev/null || $(CHROMIUM) || { $(SUDO) apt-get update -q && $(CHROMIUM); }
	$(BIN)/python -m pytest -m browser tests/serve/test_page.py

clean-demo:
	rm -rf $(DEMO_DIR)

# Offline install for a GPU node (docs/gpus.md): all but the node's torch stack, for
# CPython $(WHEELHOUSE_PYTHON) on x86-64 Linux; needs the package registry here.
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_PYTHON ?= 3.12
wheelhouse: setup
	$(BIN)/python -m fairseq_rope.gpu.wheelhouse $(WHEELHOUSE) --python-version $(WHEELHOUSE_PYTHON)
