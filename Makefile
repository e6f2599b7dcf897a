# Everything a fresh machine needs: `make demo` and `make test` install into .venv first.
PYTHON ?= python3
VENV := .venv
PIP := $(VENV)/bin/python -m pip
STAMP := $(VENV)/.installed-stamp
TORCH ?= torch==2.13.0

.PHONY: install demo test test-fast lint coverage gpu-check bench-quick bench bench-quality clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt requirements/runtime.txt requirements/test.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c requirements/constraints.txt "$(TORCH)"
	$(PIP) install -q --no-deps -c requirements/constraints.txt ve-fairseq
	$(PIP) install -q -c requirements/constraints.txt -r requirements/runtime.txt -r requirements/test.txt
	$(PIP) install -q --no-deps -e .
	touch $@

demo: install
	$(VENV)/bin/python -c "import fairseq_hybrid" 2>/dev/null
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash recipes/sample/run.sh

# The suite on both cores of a 2-core machine (at most 4 workers on a bigger one): pytest-xdist,
# tests handed out as workers free up (most of the time is fairseq CLI runs, one core each).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test: install
	$(PYTEST)

# Everyday loop: the suite without the end-to-end runs marked slow (< 1 min on 2 cores),
# after the linter. `make test` runs everything.
test-fast: install lint
	$(PYTEST) -m "not slow"

lint: install
	$(VENV)/bin/ruff check .

# The test suite under coverage, subprocesses (fairseq-train, -generate) and worker threads
# included; fails if a module of fairseq_hybrid/ with >= 40 statements is below 90%.
coverage: install
	rm -f .coverage .coverage.*
	COVERAGE_FILE=$(CURDIR)/.coverage $(VENV)/bin/python -m coverage run -m pytest -q -n $(TEST_WORKERS) --dist worksteal
	COVERAGE_FILE=$(CURDIR)/.coverage $(VENV)/bin/python -m coverage combine -q
	COVERAGE_FILE=$(CURDIR)/.coverage $(VENV)/bin/python -m coverage report
	COVERAGE_FILE=$(CURDIR)/.coverage $(VENV)/bin/python tests/coverage_gate.py

# What a GPU runs, run on a GPU (<= 8 min on one): equivalence with the CPU in float64,
# fp16/bf16/AMP training, generation, speed at the WMT sizes, the pipeline model, the LSTM's
# rate over 16-256 sentences fitted and put in the pipeline model (benchmarks/lstm_sweep.py); without
# CUDA the same checks on CPU devices at small sizes. results/bench/gpu-check-<device>.json
gpu-check: install
	$(VENV)/bin/python -m benchmarks.gpu_check

# The scaling benchmark on this machine's CPU as two devices (<= 15 min on 2 cores):
# results/bench/scaling-small-cpu-cpu.{json,png}. `make bench` runs longer timed intervals.
BENCH_DEVICES ?= cpu,cpu
bench-quick: install
	$(VENV)/bin/python -m benchmarks.scaling --preset small --devices $(BENCH_DEVICES) --quick

bench: install
	$(VENV)/bin/python -m benchmarks.scaling --preset small --devices $(BENCH_DEVICES)

# The converged quality study (docs/quality.md): fairseq lstm, hybrid_lstm and hybrid_lstm
# --input-feeding, 10 seeds each (= python -m benchmarks.quality --seeds 1,2,3,4,5,6,7,8,9,10
# --if-seeds 10), each trained until --patience stops it (at most 16,000 updates), 2 runs at a
# time, 1 thread each. Expect ~8 h for all 30 runs (~4.5 h for the 17 beyond the 13 stored) on 2
# otherwise idle cores, 2-4x that on a shared machine. Resumable: stop it anytime (Ctrl-C,
# kill) and rerun `make bench-quality`; finished runs (results/quality/runs/converged-sample/)
# are skipped, an interrupted one resumes from its checkpoint. QUALITY_ARGS=--report-only
# reports on the runs done; QUALITY_ARGS=--quick checks the path in 1-2 minutes (under
# work/quality/). Output: results/quality/converged-sample.*
bench-quality: install
	$(VENV)/bin/python -m benchmarks.quality $(QUALITY_ARGS)

clean:
	rm -rf $(VENV) work results/sample build *.egg-info .coverage .coverage.*
