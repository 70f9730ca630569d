# z2all: every target creates/uses .venv by itself, so a fresh clone needs only `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench clean gpu-check

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

demo: venv
	$(PY) -m tools.demo

test: venv
	$(PY) -m pytest

# The real CUDA kernels, NCCL, PowerSGD's side stream, ZeRO-1 offload (needs a GPU; the
# emulated flash-attn/apex tests run in `make test` everywhere).
gpu-check: venv
	$(PY) -m pytest -m cuda -v -rs tests/test_gpu_check.py

lint: venv
	$(PY) -m ruff check .

# `make bench BENCH_FLAGS=--quick` for a shorter run of every benchmark.
BENCH_FLAGS ?=
bench: venv
	@for script in bench/bench_*.py; do module=bench.$$(basename $$script .py); echo "== $$module"; \
		$(PY) -m $$module $(BENCH_FLAGS) || exit 1; done

clean:
	rm -rf out data/demo tokenizer/demo_* .pytest_cache .ruff_cache
