# z2all: every target creates/uses .venv by itself, so a fresh clone needs only `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench clean

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

demo: venv
	$(PY) -m utils.demo

test: venv
	$(PY) -m pytest

lint: venv
	$(PY) -m ruff check .

# `make bench BENCH_FLAGS=--quick` for a shorter run of every benchmark.
BENCH_FLAGS ?=
bench: venv
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script $(BENCH_FLAGS) || exit 1; done

clean:
	rm -rf out data/demo tokenizer/demo_* .pytest_cache .ruff_cache
