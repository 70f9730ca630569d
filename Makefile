# z2all: every target creates/uses .venv by itself, so a fresh clone needs only `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench clean gpu-check gpu-venv

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

demo: venv
	$(PY) -m tools.demo

# The `slow` tests (the README's, docs' and course's commands run in order, multi-node loopback
# runs, the course's exercise checks, the benches' smoke runs, the demo's clean stage, GRPO's
# 2-rank layouts, torch.compile, the monitor's kill-and-restart runs: minutes of mostly waiting
# or one-core work) run beside the others, whose
# multi-rank tests leave a core idle much of the time. Both runs must pass; the slow run's output is printed after the main one's.
test: venv
	@slow_log=$$(mktemp); \
	$(PY) -m pytest -m slow >"$$slow_log" 2>&1 & slow_pid=$$!; \
	trap 'kill $$slow_pid 2>/dev/null; rm -f "$$slow_log"' INT TERM; \
	$(PY) -m pytest -m "not slow"; main_rc=$$?; \
	wait $$slow_pid; slow_rc=$$?; \
	echo "--- the slow tests (pytest -m slow), run beside the others:"; \
	cat "$$slow_log"; rm -f "$$slow_log"; \
	exit $$(( main_rc || slow_rc ))

# The real CUDA kernels and NCCL (docs/gpu.md: what it proves). Runs in $(GPU_VENV) when
# it exists (`make gpu-venv`), else in .venv; fails, never skips, without a CUDA device. The
# emulated flash-attn/apex tests run in `make test` everywhere; the `cuda` tests skip there.
GPU_VENV ?= .venv-gpu
gpu-check:
	@if [ -x $(GPU_VENV)/bin/python ]; then py=$(GPU_VENV)/bin/python; \
	else $(MAKE) --no-print-directory venv && py=$(PY); fi; \
	$$py -m tools.gpu_check && $$py -m pytest -m cuda -v -s -rs tests/test_gpu_check.py

# A CUDA venv for gpu-check and GPU training: CUDA torch of the pinned version, flash-attn,
# NVIDIA apex with its C++/CUDA extensions (compiled: needs nvcc matching CUDA_INDEX; ~20 min).
CUDA_INDEX ?= cu128
gpu-venv:
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install --upgrade pip setuptools wheel packaging ninja
	$(GPU_VENV)/bin/pip install torch==$$(sed -n 's/^torch==//p' requirements.txt) \
		--index-url https://download.pytorch.org/whl/$(CUDA_INDEX)
	grep -v '^torch==' requirements.txt | $(GPU_VENV)/bin/pip install -r /dev/stdin
	$(GPU_VENV)/bin/pip install flash-attn --no-build-isolation
	rm -rf $(GPU_VENV)/apex-src && git clone --depth 1 https://github.com/NVIDIA/apex $(GPU_VENV)/apex-src
	cd $(GPU_VENV)/apex-src && APEX_CPP_EXT=1 APEX_CUDA_EXT=1 ../bin/pip install -v \
		--no-build-isolation --config-settings "--build-option=--cpp_ext" \
		--config-settings "--build-option=--cuda_ext" .

lint: venv
	$(PY) -m ruff check .

# `make bench BENCH_FLAGS=--quick` for a shorter run of every benchmark.
BENCH_FLAGS ?=
bench: venv
	@for script in bench/bench_*.py; do module=bench.$$(basename $$script .py); echo "== $$module"; \
		$(PY) -m $$module $(BENCH_FLAGS) || exit 1; done

clean:
	rm -rf out data/demo tokenizer/demo_* hf_model hf_merged hf_adapter .pytest_cache .ruff_cache
